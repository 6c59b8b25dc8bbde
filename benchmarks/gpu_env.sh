# Sourced by the GPU scripts (`. benchmarks/gpu_env.sh || exit`, from the repository root): the
# wheels carried in .whl/ installed to /tmp/site where the GPU host lacks the store's, the search's
# or CUTLASS's packages (or those named in GPU_ENV_NEEDS), this checkout first on PYTHONPATH, and
# the kernel cache in /tmp (CUTLASS_TUNE_CACHE_DIR, unless set).
needs="optuna, sqlalchemy, alembic, cutlass_library${GPU_ENV_NEEDS:+, $GPU_ENV_NEEDS}"
if ! python3 -c "import $needs" 2>/dev/null && compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || return 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export CUTLASS_TUNE_CACHE_DIR=${CUTLASS_TUNE_CACHE_DIR:-/tmp/cutlass-tune-cache}
