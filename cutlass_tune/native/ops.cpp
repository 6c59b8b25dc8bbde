// The operators torch.ops.cutlass_tune.mm, .linear and .grouped_mm in C++ (and, in the CUDA build,
// the autograd of moe.cu's moe_gather and moe_combine), and the module
// cutlass_tune_native that attaches them to the package's Python side (runtime/_native.py).
//
// Per call on CUDA: a signature of the tensors' metadata (sizes, strides, dtypes, devices and the
// arguments that change the plan) is looked up in a hash map per table key; an entry says what
// runs: a tuned kernel through its C ABI (cutlass_tune_args.h), torch's own operator, or the
// package's Python door. A signature not seen yet is resolved once in Python (the dispatcher's
// `prepare`, which says a fallback to torch once), which hands back plain data: the kernel's
// entry points, its argument template, its workspace policy. The Autograd kernels go below
// autograd at C++ cost where no gradient is needed, and through C++ autograd Functions (the
// Python formulas' backward, in C++) where one is.
#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/library.h>
#include <torch/version.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include "cutlass_tune_args.h"

#ifndef CUTLASS_TUNE_NATIVE_CUDA
#define CUTLASS_TUNE_NATIVE_CUDA 0
#endif

#if CUTLASS_TUNE_NATIVE_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <dlfcn.h>
#endif

namespace py = pybind11;

namespace __attribute__((visibility("hidden"))) cutlass_tune_native {

// ---------------------------------------------------------------------------------------------
// The Python side: functions of runtime/_native.py, set once by `attach`.

struct Hooks {
  py::object resolve;   // resolve(op, *args) -> entry tuple
  py::object door;      // door(op, *args) -> Tensor: today's Python CUDA kernel
  py::object autograd;  // autograd(op, *args) -> Tensor: the Python autograd formula
  py::object refused;   // refused(op, table, name, code): a kernel CUTLASS refused, said once
  py::object may_keep;  // may_keep(device, stream) -> bool: a workspace may be kept past the call
};

Hooks* hooks() {
  static Hooks* h = new Hooks();  // never destroyed: Python objects outlive no interpreter
  return h;
}

// How often C++ called each hook: what a test reads to see that a call ran no Python.
struct HookCalls {
  std::atomic<int64_t> resolve{0}, door{0}, autograd{0};
};

HookCalls* hook_calls() {
  static HookCalls* c = new HookCalls();
  return c;
}

void require_hooks() {
  TORCH_CHECK(hooks()->resolve && !hooks()->resolve.is_none(),
              "cutlass_tune: the native operators are loaded but not attached to the Python package "
              "(import cutlass_tune.runtime first)");
}

py::object dtype_object(const std::optional<at::ScalarType>& t) {
  if (!t.has_value()) {
    return py::none();
  }
  return py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(torch::getTHPDtype(*t)));
}

// Arguments as the Python side takes them, converted with the GIL held: a dtype as torch.dtype.
py::object to_python(const std::optional<at::ScalarType>& t) { return dtype_object(t); }

template <class T>
const T& to_python(const T& x) {
  return x;
}

// ---------------------------------------------------------------------------------------------
// Call signatures and plan entries

struct Signature {
  std::array<int64_t, 40> v{};
  int n = 0;
  void add(int64_t x) {
    TORCH_INTERNAL_ASSERT(n < static_cast<int>(v.size()));
    v[n++] = x;
  }
  void add(const at::Tensor& t) {
    add(t.dim());
    for (int64_t i = 0; i < t.dim(); ++i) {
      add(t.size(i));
      add(t.stride(i));
    }
    add(static_cast<int64_t>(t.scalar_type()));
    add(t.get_device());
  }
  void add(const std::optional<at::Tensor>& t) {
    if (t.has_value()) {
      add(*t);
    } else {
      add(-1);
    }
  }
  void add_real(double x) {
    int64_t bits = 0;
    std::memcpy(&bits, &x, sizeof(bits));
    add(bits);
  }
  bool operator==(const Signature& o) const {
    return n == o.n && std::memcmp(v.data(), o.v.data(), sizeof(int64_t) * n) == 0;
  }
};

struct SignatureHash {
  size_t operator()(const Signature& s) const {
    uint64_t h = 1469598103934665603ULL;
    for (int i = 0; i < s.n; ++i) {
      h = (h ^ static_cast<uint64_t>(s.v[i])) * 1099511628211ULL;
    }
    return static_cast<size_t>(h);
  }
};

enum EntryKind : int {
  PYTHON = 0,  // the package's Python door computes every call of the signature
  TORCH = 1,   // torch's own operator (at::_grouped_mm, at::mm), called here
  EMPTY = 2,   // nothing to compute: an empty result
  KERNEL = 3,  // a tuned kernel through its C ABI
};

enum WorkspacePolicy : int { WS_NONE = 0, WS_KEPT = 1, WS_PER_CALL = 2 };

constexpr size_t kReadyInstances = 256;  // as the Python path's READY_GROUPED

struct AddressSet {
  std::array<uintptr_t, 10> v{};
  bool operator==(const AddressSet& o) const { return v == o.v; }
};

struct AddressHash {
  size_t operator()(const AddressSet& s) const {
    uint64_t h = 1469598103934665603ULL;
    for (auto x : s.v) {
      h = (h ^ static_cast<uint64_t>(x)) * 1099511628211ULL;
    }
    return static_cast<size_t>(h);
  }
};

struct Entry {
  std::atomic<int> kind{PYTHON};
  std::string name;
  std::string range;  // the profiler range of the problem (kernel and torch entries)
  bool fast_accum = false;  // a torch entry of fp8 operands: torch._scaled_mm's fast accumulation
  cutlass_tune_create_fn create = nullptr;
  cutlass_tune_destroy_fn destroy = nullptr;
  cutlass_tune_initialize_fn initialize = nullptr;
  cutlass_tune_run_fn run = nullptr;
  cutlass_tune_args args{};
  int workspace = WS_NONE;
  int64_t workspace_bytes = 0;
  bool initialize_every_launch = false;
  // The ready instances by address set (stream included), least recently used first.
  std::mutex mu;
  std::list<std::pair<AddressSet, void*>> lru;
  std::unordered_map<AddressSet, std::list<std::pair<AddressSet, void*>>::iterator, AddressHash> ready;

  ~Entry() {  // a forgotten table's plans (the launches already enqueued hold copies of what they read)
    for (auto& item : lru) {
      destroy(item.second);
    }
  }
};

using Plans = std::unordered_map<Signature, std::shared_ptr<Entry>, SignatureHash>;

struct Tables {
  std::shared_mutex mu;
  std::unordered_map<std::string, Plans> plans;  // by plan set: a table key, or the set a key is bound to
  // An operator's table key -> the plan set of the table bound to it (`bind`): rebinding a key to
  // a table it had before finds that table's plans again instead of resolving every signature anew.
  std::unordered_map<std::string, std::string> bound;
};

Tables* tables() {
  static Tables* t = new Tables();
  return t;
}

// The plan set of a table key (the caller holds t->mu).
const std::string& plan_set(const Tables* t, const std::string& table) {
  auto found = t->bound.find(table);
  return found == t->bound.end() ? table : found->second;
}

std::shared_ptr<Entry> find_entry(const std::string& table, const Signature& sig) {
  auto* t = tables();
  std::shared_lock<std::shared_mutex> lock(t->mu);
  auto found = t->plans.find(plan_set(t, table));
  if (found == t->plans.end()) {
    return nullptr;
  }
  auto entry = found->second.find(sig);
  return entry == found->second.end() ? nullptr : entry->second;
}

// An entry from what the Python resolver returned:
// (kind, name, (create, destroy, initialize, run), args bytes, workspace policy, workspace bytes,
//  initialize every launch).
std::shared_ptr<Entry> entry_of(const py::tuple& plan) {
  auto e = std::make_shared<Entry>();
  int kind = plan[0].cast<int>();
  if (kind == KERNEL) {
    e->name = plan[1].cast<std::string>();
    auto fns = plan[2].cast<py::tuple>();
    e->create = reinterpret_cast<cutlass_tune_create_fn>(fns[0].cast<uintptr_t>());
    e->destroy = reinterpret_cast<cutlass_tune_destroy_fn>(fns[1].cast<uintptr_t>());
    e->initialize = reinterpret_cast<cutlass_tune_initialize_fn>(fns[2].cast<uintptr_t>());
    e->run = reinterpret_cast<cutlass_tune_run_fn>(fns[3].cast<uintptr_t>());
    std::string args = plan[3].cast<std::string>();
    TORCH_CHECK(args.size() == sizeof(cutlass_tune_args), "cutlass_tune: a plan's arguments are ", args.size(),
                " bytes; struct cutlass_tune_args is ", sizeof(cutlass_tune_args));
    std::memcpy(&e->args, args.data(), sizeof(cutlass_tune_args));
    e->workspace = plan[4].cast<int>();
    e->workspace_bytes = plan[5].cast<int64_t>();
    e->initialize_every_launch = plan[6].cast<bool>();
    e->range = plan[7].cast<std::string>();
  } else if (kind == TORCH && plan.size() > 1) {
    e->range = plan[1].cast<std::string>();
    e->fast_accum = plan.size() > 2 && plan[2].cast<bool>();
  }
  e->kind.store(kind);
  return e;
}

// The problem's profiler range around what C++ runs for an entry (a kernel or torch's operator;
// the Python door opens its own), opened only while a profiler listens: a profile, and
// tune-model's attribution of kernels to problems, see the native calls as the Python doors'.
struct ProblemRange {
  std::optional<at::RecordFunction> guard;
  explicit ProblemRange(const Entry& e) {
    if (e.range.empty() || !at::hasCallbacks()) {
      return;
    }
    const int kind = e.kind.load();
    if (kind != KERNEL && kind != TORCH) {
      return;
    }
    guard.emplace(at::RecordScope::USER_SCOPE);
    if (guard->isActive()) {
      guard->before(e.range.c_str());
    } else {
      guard.reset();
    }
  }
};

// Inductor's out variants (`*_out` below; runtime/_lowering.py): the buffer Inductor allocated for
// a call's result, which the call's kernel (or torch's out= operator) writes instead of a new
// tensor. Taken once, by the first result of the call; a Python hook (resolve, door) never sees it.
thread_local at::Tensor* out_target = nullptr;

// The out variant's buffer as an M x N tensor where it fits a result of `dtype` on `device`
// (contiguous, M * N elements), taken; else nullopt and the caller allocates.
std::optional<at::Tensor> take_out(int64_t m, int64_t n, at::ScalarType dtype, const at::Device& device) {
  at::Tensor* t = out_target;
  if (t == nullptr) {
    return std::nullopt;
  }
  out_target = nullptr;
  if (!t->is_contiguous() || t->numel() != m * n || t->scalar_type() != dtype || t->device() != device) {
    return std::nullopt;
  }
  return t->view({m, n});
}

// A result's M x N buffer: the out variant's where it fits, else a new tensor.
at::Tensor result_buffer(int64_t m, int64_t n, const at::TensorOptions& options) {
  if (auto out = take_out(m, n, options.dtype().toScalarType(), options.device())) {
    return *out;
  }
  return at::empty({m, n}, options);
}

// Hides the out variant's buffer from a Python hook and what it calls, for the hook's duration.
struct HiddenOut {
  at::Tensor* saved = out_target;
  HiddenOut() { out_target = nullptr; }
  ~HiddenOut() { out_target = saved; }
};

// The entry of `sig`, resolved in Python on a miss (`resolve(op, *args)`).
template <class... Args>
std::shared_ptr<Entry> entry_for(const char* op, const std::string& table, const Signature& sig, const Args&... args) {
  auto entry = find_entry(table, sig);
  if (entry) {
    return entry;
  }
  require_hooks();
  hook_calls()->resolve.fetch_add(1, std::memory_order_relaxed);
  {
    const HiddenOut hidden;
    py::gil_scoped_acquire gil;
    entry = entry_of(hooks()->resolve(op, to_python(args)...).template cast<py::tuple>());
  }
  auto* t = tables();
  std::unique_lock<std::shared_mutex> lock(t->mu);
  return t->plans[plan_set(t, table)].emplace(sig, entry).first->second;
}

template <class... Args>
at::Tensor call_door(const char* op, const Args&... args) {
  require_hooks();
  hook_calls()->door.fetch_add(1, std::memory_order_relaxed);
  out_target = nullptr;  // the door's result is a tensor of its own
  py::gil_scoped_acquire gil;
  return hooks()->door(op, to_python(args)...).template cast<at::Tensor>();
}

template <class... Args>
at::Tensor call_autograd(const char* op, const Args&... args) {
  require_hooks();
  hook_calls()->autograd.fetch_add(1, std::memory_order_relaxed);
  py::gil_scoped_acquire gil;
  return hooks()->autograd(op, to_python(args)...).template cast<at::Tensor>();
}

bool fp8(at::ScalarType t) { return t == at::kFloat8_e4m3fn || t == at::kFloat8_e5m2; }

bool aligned(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

bool aligned(const std::optional<at::Tensor>& t) { return !t.has_value() || aligned(*t); }

uintptr_t address(const std::optional<at::Tensor>& t) {
  return t.has_value() ? reinterpret_cast<uintptr_t>(t->data_ptr()) : 0;
}

// ---------------------------------------------------------------------------------------------
// Activations (space.Activation), as torch computes them and their gradients (_torch.ACTIVATION,
// ACTIVATION_GRAD)

enum ActivationKind : int { ACT_UNKNOWN = -1, ACT_NONE = 0, ACT_RELU, ACT_GELU, ACT_GELU_TANH, ACT_SILU };

ActivationKind activation_kind(c10::string_view name) {
  if (name == "none") return ACT_NONE;
  if (name == "relu") return ACT_RELU;
  if (name == "gelu") return ACT_GELU;
  if (name == "gelu_tanh") return ACT_GELU_TANH;
  if (name == "silu") return ACT_SILU;
  return ACT_UNKNOWN;  // one C++ does not know: the Python side computes it
}

at::Tensor activate(ActivationKind act, const at::Tensor& z) {
  switch (act) {
    case ACT_RELU: return at::relu(z);
    case ACT_GELU: return at::gelu(z, "none");
    case ACT_GELU_TANH: return at::gelu(z, "tanh");
    case ACT_SILU: return at::silu(z);
    default: return z;
  }
}

// `activate` in place on `z` (a result buffer of the call's own).
at::Tensor& activate_(ActivationKind act, at::Tensor& z) {
  switch (act) {
    case ACT_RELU: return at::relu_(z);
    case ACT_GELU: return at::gelu_(z, "none");
    case ACT_GELU_TANH: return at::gelu_(z, "tanh");
    case ACT_SILU: return at::silu_(z);
    default: return z;
  }
}

// d activation(z) / dz times `grad`, by torch's own backward ops (ActivationFacets.backward).
at::Tensor activation_grad(ActivationKind act, const at::Tensor& grad, const at::Tensor& z) {
  switch (act) {
    case ACT_RELU: return at::threshold_backward(grad, z, 0);
    case ACT_GELU: return at::gelu_backward(grad, z, "none");
    case ACT_GELU_TANH: return at::gelu_backward(grad, z, "tanh");
    case ACT_SILU: return at::silu_backward(grad, z);
    default: return grad;
  }
}

// torch's path for `linear` (runtime/_matmul.py's torch_gemm as _op._torch_linear calls it): a
// bias alone is F.linear's addmm, with ReLU or tanh GELU on CUDA cuBLASLt's epilogue
// (_addmm_activation); a residual is addmm's C, the bias then added; gated, the activation of
// the gate times the product. `x2`, `c` are M x K and M x N. Without a residual or gate the result
// is written by torch's out= operators into `result_buffer` (a compiled graph's buffer where the
// out variant gave one: no tensor of its own and no copy into it), the activation in place.
at::Tensor torch_linear(const at::Tensor& x2, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                        ActivationKind act, const std::optional<at::Tensor>& residual,
                        const std::optional<at::Tensor>& gate) {
  const at::Tensor wt = weight.t();
  const bool has_bias = bias.has_value() && bias->defined();
  if (gate.has_value()) {
    at::Tensor y = has_bias ? at::addmm(bias->contiguous(), x2, wt) : at::matmul(x2, wt);
    return activate(act, *gate) * y;
  }
  if (residual.has_value()) {
    at::Tensor y = at::addmm(*residual, x2, wt);
    if (has_bias) {
      y = y + bias->contiguous();
    }
    return activate(act, y);
  }
  at::Tensor y = result_buffer(x2.size(0), weight.size(0), x2.options());
  if (has_bias && (act == ACT_RELU || act == ACT_GELU_TANH) && x2.is_cuda()) {
    return at::_addmm_activation_out(y, bias->contiguous(), x2, wt, 1, 1, act == ACT_GELU_TANH);
  }
  if (has_bias) {
    at::addmm_out(y, bias->contiguous(), x2, wt);
  } else {
    at::mm_out(y, x2, wt);
  }
  return activate_(act, y);
}

// ---------------------------------------------------------------------------------------------
// The launch (CUDA)

#if CUTLASS_TUNE_NATIVE_CUDA

const char* status_name(int code) {
  static const char* names[] = {"kSuccess", "kErrorMisalignedOperand", "kErrorInvalidDataType",
                                "kErrorInvalidLayout", "kErrorInvalidProblem", "kErrorNotSupported",
                                "kErrorWorkspaceNull", "kErrorInternal", "kErrorArchMismatch",
                                "kErrorInsufficientDriver", "kErrorMemoryAllocation", "kInvalid"};
  return code >= 0 && code < static_cast<int>(sizeof(names) / sizeof(names[0])) ? names[code] : "an unknown status";
}

// The driver's functions, from the libcuda torch has loaded: no link to the CUDA runtime.
struct Driver {
  int (*ctx_get_current)(void**) = nullptr;
  int (*device_get)(int*, int) = nullptr;
  int (*primary_ctx_retain)(void**, int) = nullptr;
  int (*ctx_set_current)(void*) = nullptr;
  int (*stream_is_capturing)(void*, int*) = nullptr;
};

const Driver& driver() {
  static const Driver d = [] {
    Driver out;
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    TORCH_CHECK(lib != nullptr, "cutlass_tune: cannot load the CUDA driver (libcuda.so.1)");
    out.ctx_get_current = reinterpret_cast<int (*)(void**)>(dlsym(lib, "cuCtxGetCurrent"));
    out.device_get = reinterpret_cast<int (*)(int*, int)>(dlsym(lib, "cuDeviceGet"));
    out.primary_ctx_retain = reinterpret_cast<int (*)(void**, int)>(dlsym(lib, "cuDevicePrimaryCtxRetain"));
    out.ctx_set_current = reinterpret_cast<int (*)(void*)>(dlsym(lib, "cuCtxSetCurrent"));
    out.stream_is_capturing = reinterpret_cast<int (*)(void*, int*)>(dlsym(lib, "cuStreamIsCapturing"));
    TORCH_CHECK(out.ctx_get_current && out.device_get && out.primary_ctx_retain && out.ctx_set_current &&
                    out.stream_is_capturing,
                "cutlass_tune: the CUDA driver lacks a function the native operators call");
    return out;
  }();
  return d;
}

// A kernel's initialize builds TMA descriptors through the driver, which needs a current
// context: a thread that ran no CUDA work yet (autograd's) has none (kernel/_context.py).
void bind_primary_context(int device) {
  const Driver& d = driver();
  void* current = nullptr;
  TORCH_CHECK(d.ctx_get_current(&current) == 0, "cutlass_tune: cuCtxGetCurrent failed");
  if (current != nullptr) {
    return;
  }
  int handle = 0;
  void* primary = nullptr;
  TORCH_CHECK(d.device_get(&handle, device) == 0 && d.primary_ctx_retain(&primary, handle) == 0 &&
                  d.ctx_set_current(primary) == 0,
              "cutlass_tune: cannot make device ", device, "'s primary context current");
}

bool capturing(cudaStream_t stream) {
  int status = 0;
  // An error (the legacy stream while another captures globally) counts as capturing: the
  // workspace then comes per call, right in every case.
  return driver().stream_is_capturing(stream, &status) != 0 || status != 0;
}

// The workspaces kept per device and stream, grown as needed.
struct KeptWorkspaces {
  std::mutex mu;
  std::unordered_map<uint64_t, std::pair<c10::DataPtr, int64_t>> by_stream;
};

KeptWorkspaces* kept() {
  static KeptWorkspaces* k = new KeptWorkspaces();
  return k;
}

void* kept_workspace(int device, cudaStream_t stream, int64_t bytes) {
  auto* k = kept();
  const uint64_t key = reinterpret_cast<uint64_t>(stream) * 64 + static_cast<uint64_t>(device);
  {
    std::lock_guard<std::mutex> lock(k->mu);
    auto found = k->by_stream.find(key);
    if (found != k->by_stream.end() && found->second.second >= bytes) {
      return found->second.first.get();
    }
  }
  bool keep = true;
  {
    py::gil_scoped_acquire gil;  // rare: once per stream, and where a workspace grows
    keep = hooks()->may_keep(device, reinterpret_cast<uint64_t>(stream)).cast<bool>();
  }
  if (!keep) {
    return nullptr;
  }
  auto space = c10::cuda::CUDACachingAllocator::get()->allocate(static_cast<size_t>(bytes));
  void* ptr = space.get();
  std::lock_guard<std::mutex> lock(k->mu);
  k->by_stream[key] = std::make_pair(std::move(space), bytes);
  return ptr;
}

struct Refused {
  int code;
};

// Launch `e` with the addresses in `args` on the current stream of `device`. Raises Refused
// where CUTLASS refuses the problem at initialize, a c10::Error where the launch fails.
void launch(const char* op, Entry& e, int device, cutlass_tune_args& args) {
  bind_primary_context(device);  // before any driver call: cuStreamIsCapturing needs a context too
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
  c10::DataPtr per_call;
  void* workspace = nullptr;
  if (e.workspace_bytes > 0) {
    if (e.workspace == WS_KEPT && !capturing(stream)) {
      workspace = kept_workspace(device, stream, e.workspace_bytes);
    }
    if (workspace == nullptr) {
      per_call = c10::cuda::CUDACachingAllocator::get()->allocate(static_cast<size_t>(e.workspace_bytes));
      workspace = per_call.get();
    }
  }
  AddressSet key;
  key.v = {reinterpret_cast<uintptr_t>(stream), reinterpret_cast<uintptr_t>(args.a),
           reinterpret_cast<uintptr_t>(args.b), reinterpret_cast<uintptr_t>(args.c),
           reinterpret_cast<uintptr_t>(args.d), reinterpret_cast<uintptr_t>(args.bias),
           reinterpret_cast<uintptr_t>(args.scale_a), reinterpret_cast<uintptr_t>(args.scale_b),
           reinterpret_cast<uintptr_t>(args.offsets), reinterpret_cast<uintptr_t>(workspace)};
  std::lock_guard<std::mutex> lock(e.mu);
  void* instance = nullptr;
  auto found = e.ready.find(key);
  if (found != e.ready.end()) {
    e.lru.splice(e.lru.end(), e.lru, found->second);
    instance = found->second->second;
  }
  if (instance == nullptr || e.initialize_every_launch) {
    if (instance == nullptr) {
      if (e.lru.size() >= kReadyInstances) {  // the least recently used is initialized again
        instance = e.lru.front().second;
        e.ready.erase(e.lru.front().first);
        e.lru.pop_front();
      } else {
        instance = e.create();
        TORCH_CHECK(instance != nullptr, "cutlass_tune.", op, ": ", e.name, "_create returned NULL");
      }
      e.lru.emplace_back(key, instance);
      e.ready[key] = std::prev(e.lru.end());
    }
    int code = e.initialize(instance, &args, workspace, stream);
    if (code != 0) {
      e.ready.erase(key);
      e.lru.pop_back();
      e.destroy(instance);
      throw Refused{code};
    }
  }
  int code = e.run(instance, stream);
  TORCH_CHECK(code == 0, "cutlass_tune.", op, ": kernel ", e.name, " failed to launch (", status_name(code), ")");
}

// A kernel CUTLASS refused for a signature: said once from Python, and the signature's calls go
// to the Python door from now on (which keeps torch's path for it).
void refuse(const char* op, const std::string& table, Entry& e, int code) {
  e.kind.store(PYTHON);
  py::gil_scoped_acquire gil;
  hooks()->refused(op, table, e.name, code);
}

// What a grouped entry computes: its kernel, torch's grouped GEMM, an empty result; nullopt
// where the Python door computes the call instead. `glu`: the kernel's epilogue pairs gate and
// up columns (a GLU gate_up problem), its result M x N/2; torch's path for it is the Python door's.
std::optional<at::Tensor> grouped_planned(const char* op, const std::string& table, Entry& entry, const at::Tensor& a,
                                          const at::Tensor& b, const at::Tensor& offs,
                                          std::optional<at::ScalarType> out_dtype, bool glu = false) {
  const int device = a.get_device();
  const ProblemRange range(entry);
  const int64_t cols = glu ? b.size(2) / 2 : b.size(2);
  switch (entry.kind.load()) {
    case KERNEL: {
      if (!(aligned(a) && aligned(b))) {
        break;
      }
      c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
      at::Tensor out = result_buffer(a.size(0), cols, a.options().dtype(out_dtype.value_or(a.scalar_type())));
      cutlass_tune_args args = entry.args;
      args.a = a.data_ptr();
      args.b = b.data_ptr();
      args.d = out.data_ptr();
      args.c = args.d;
      args.offsets = offs.data_ptr();
      try {
        launch(op, entry, device, args);
        return out;
      } catch (const Refused& r) {
        refuse(op, table, entry, r.code);
      }
      break;
    }
    case TORCH:
      if (glu) {
        break;
      }
      return at::_grouped_mm(a, b, offs);
    case EMPTY:
      return at::empty({0, cols}, a.options().dtype(out_dtype.value_or(a.scalar_type())));
    default:
      break;
  }
  return std::nullopt;
}

at::Tensor grouped_mm_cuda(const at::Tensor& a, const at::Tensor& b, const at::Tensor& offs, c10::string_view table_,
                           std::optional<at::ScalarType> out_dtype) {
  std::string table(table_);
  if (a.dim() != 2 || b.dim() != 3 || offs.dim() != 1) {
    return call_door("grouped_mm", a, b, offs, table, out_dtype);  // it raises, naming the problem
  }
  Signature sig;
  sig.add(a);
  sig.add(b);
  sig.add(offs);
  sig.add(out_dtype.has_value() ? static_cast<int64_t>(*out_dtype) : -1);
  auto entry = entry_for("grouped_mm", table, sig, a, b, offs, table, out_dtype);
  if (auto out = grouped_planned("grouped_mm", table, *entry, a, b, offs, out_dtype)) {
    return *out;
  }
  return call_door("grouped_mm", a, b, offs, table, out_dtype);
}

// The dense kernels: D = epilogue(a2 @ b) of a2 M x K and b K x N, c the residual or gate.
at::Tensor dense(const char* op, Entry& e, const at::Tensor& a2, const at::Tensor& b, at::ScalarType out_dtype,
                 const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& c, bool* ran,
                 const std::optional<at::Tensor>& scale_a = std::nullopt,
                 const std::optional<at::Tensor>& scale_b = std::nullopt) {
  const int device = a2.get_device();
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  at::Tensor out = result_buffer(a2.size(0), b.size(1), a2.options().dtype(out_dtype));
  cutlass_tune_args args = e.args;
  args.a = a2.data_ptr();
  args.b = b.data_ptr();
  args.d = out.data_ptr();
  args.c = c.has_value() ? c->data_ptr() : args.d;
  args.bias = bias.has_value() ? bias->data_ptr() : nullptr;
  if (scale_a.has_value()) {
    args.scale_a = scale_a->data_ptr();
    args.scale_b = scale_b->data_ptr();
  }
  launch(op, e, device, args);
  *ran = true;
  return out;
}

std::vector<int64_t> out_shape(const at::Tensor& x, int64_t n) {
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = n;
  return shape;
}

at::Tensor mm_cuda(const at::Tensor& a, const at::Tensor& b, c10::string_view table_,
                   std::optional<at::ScalarType> out_dtype) {
  std::string table(table_);
  if (a.dim() < 1 || b.dim() != 2 || a.size(-1) != b.size(0)) {
    return call_door("mm", a, b, table, out_dtype);
  }
  at::Tensor a2 = a.dim() == 2 ? a : a.reshape({-1, a.size(-1)});
  Signature sig;
  sig.add(a2);
  sig.add(b);
  sig.add(out_dtype.has_value() ? static_cast<int64_t>(*out_dtype) : -1);
  auto entry = entry_for("mm", table, sig, a, b, table, out_dtype);
  const ProblemRange range(*entry);
  switch (entry->kind.load()) {
    case KERNEL: {
      if (!(aligned(a2) && aligned(b))) {
        break;
      }
      const bool is_fp8 = fp8(a.scalar_type());
      const auto dtype = out_dtype.value_or(is_fp8 ? at::kBFloat16 : a.scalar_type());
      bool ran = false;
      try {
        at::Tensor out = dense("mm", *entry, a2, b, dtype, std::nullopt, std::nullopt, &ran);
        return a.dim() == 2 ? out : out.view(out_shape(a, b.size(1)));
      } catch (const Refused& r) {
        refuse("mm", table, *entry, r.code);
      }
      break;
    }
    case TORCH: {
      auto given = take_out(a2.size(0), b.size(1), a.scalar_type(), a.device());
      at::Tensor out = given ? at::mm_out(*given, a2, b) : at::mm(a2, b);
      return a.dim() == 2 ? out : out.view(out_shape(a, b.size(1)));
    }
    default:
      break;
  }
  return call_door("mm", a, b, table, out_dtype);
}

// An interned activation name: a small integer for the call's signature.
int64_t activation_id(c10::string_view name) {
  static std::mutex mu;
  static auto* ids = new std::unordered_map<std::string, int64_t>();
  std::lock_guard<std::mutex> lock(mu);
  auto found = ids->find(std::string(name));
  if (found != ids->end()) {
    return found->second;
  }
  const int64_t id = static_cast<int64_t>(ids->size());
  ids->emplace(std::string(name), id);
  return id;
}

at::Tensor linear_cuda(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                       c10::string_view activation_, c10::string_view table_,
                       const std::optional<at::Tensor>& residual, const std::optional<at::Tensor>& gate) {
  std::string table(table_), activation(activation_);
  if (x.dim() < 1 || weight.dim() != 2 || x.size(-1) != weight.size(1) || (residual.has_value() && gate.has_value())) {
    return call_door("linear", x, weight, bias, activation, table, residual, gate);
  }
  const int64_t n = weight.size(0);
  at::Tensor x2 = x.dim() == 2 ? x : x.reshape({-1, x.size(-1)});
  std::optional<at::Tensor> c;
  if (residual.has_value() || gate.has_value()) {
    const at::Tensor& t = residual.has_value() ? *residual : *gate;
    if (t.dim() < 1 || t.size(-1) != n) {
      return call_door("linear", x, weight, bias, activation, table, residual, gate);
    }
    c = t.dim() == 2 ? t : t.reshape({-1, n});
  }
  Signature sig;
  sig.add(x2);
  sig.add(weight);
  sig.add(bias);
  sig.add(residual.has_value() ? c : std::nullopt);
  sig.add(gate.has_value() ? c : std::nullopt);
  sig.add(activation_id(activation_));
  auto entry = entry_for("linear", table, sig, x, weight, bias, activation, table, residual, gate);
  const ProblemRange range(*entry);
  const int kind = entry->kind.load();
  if (kind == KERNEL && aligned(x2) && aligned(weight) && aligned(bias) && aligned(c)) {
    bool ran = false;
    try {
      at::Tensor out = dense("linear", *entry, x2, weight.t(), x.scalar_type(), bias, c, &ran);
      return x.dim() == 2 ? out : out.view(out_shape(x, n));
    } catch (const Refused& r) {
      refuse("linear", table, *entry, r.code);
    }
  } else if (kind == TORCH) {
    // The resolver said the fallback once (the table has no kernel for the epilogue, or keeps torch).
    const ActivationKind act = activation_kind(activation_);
    if (act != ACT_UNKNOWN) {
      at::Tensor out = torch_linear(x2, weight, bias, act, residual.has_value() ? c : std::nullopt,
                                    gate.has_value() ? c : std::nullopt);
      return x.dim() == 2 ? out : out.reshape(out_shape(x, n));
    }
  }
  return call_door("linear", x, weight, bias, activation, table, residual, gate);
}

// The function doors `cutlass_tune.matmul` (16-bit, or fp8 with per-tensor or row-wise scales;
// no epilogue) and `cutlass_tune.grouped_mm` (no scales, no activation), called from Python with
// a key of their table (runtime/_native.py's door_key): the same plans as the Python doors
// (their signatures, min_ratio and workspace policy), resolved once per signature, which checks
// the call as the door does; a call the checks would refuse that the signature cannot see
// (a misaligned address, a tensor off CUDA) goes to the Python door, which raises as before.
at::Tensor door_matmul(const at::Tensor& a, const at::Tensor& b, const std::string& table,
                       std::optional<at::ScalarType> out_dtype, const std::optional<at::Tensor>& scale_a,
                       const std::optional<at::Tensor>& scale_b, double min_ratio) {
  const bool scaled = scale_a.has_value() && scale_b.has_value();
  if (a.dim() != 2 || b.dim() != 2 || !a.is_cuda() || scale_a.has_value() != scale_b.has_value() ||
      (scaled && (scale_a->dim() > 2 || scale_b->dim() > 2)) || !(aligned(a) && aligned(b) && aligned(scale_a) &&
                                                                  aligned(scale_b))) {
    return call_door("matmul", a, b, table, out_dtype, scale_a, scale_b, min_ratio);
  }
  Signature sig;
  sig.add(a);
  sig.add(b);
  sig.add(out_dtype.has_value() ? static_cast<int64_t>(*out_dtype) : -1);
  sig.add(scale_a);
  sig.add(scale_b);
  sig.add_real(min_ratio);
  auto entry = entry_for("matmul", table, sig, a, b, table, out_dtype, scale_a, scale_b, min_ratio);
  const ProblemRange range(*entry);
  switch (entry->kind.load()) {
    case KERNEL: {
      const auto dtype = out_dtype.value_or(fp8(a.scalar_type()) ? at::kBFloat16 : a.scalar_type());
      bool ran = false;
      try {
        return dense("matmul", *entry, a, b, dtype, std::nullopt, std::nullopt, &ran, scale_a, scale_b);
      } catch (const Refused& r) {
        refuse("matmul", table, *entry, r.code);
      }
      break;
    }
    case TORCH:
      if (scaled) {  // fp8 with per-tensor or row-wise scales: the Python fallback's call
        return at::_scaled_mm(a, b, *scale_a, *scale_b, std::nullopt, std::nullopt,
                              out_dtype.value_or(at::kBFloat16), entry->fast_accum);
      }
      return at::mm(a, b);
    default:
      break;
  }
  return call_door("matmul", a, b, table, out_dtype, scale_a, scale_b, min_ratio);
}

// The fp8 operator `scaled_mm` (runtime/_op.py: what Fp8Linear calls under torch.compile): a @ b
// with per-tensor or row-wise scales (and a bias) by the table's kernel, resolved once per
// signature in Python as `mm` is (matmul's default min_ratio); where the table keeps torch,
// torch._scaled_mm with the fast accumulation the Python fallback uses (the entry's
// `fast_accum`). Block-wise scales, and calls the checks refuse, go to the Python kernel.
at::Tensor scaled_mm_cuda(const at::Tensor& a, const at::Tensor& b, const at::Tensor& scale_a, const at::Tensor& scale_b,
                          const std::optional<at::Tensor>& bias, c10::string_view table_, at::ScalarType out_dtype) {
  std::string table(table_);
  const std::optional<at::ScalarType> dtype(out_dtype);
  if (a.dim() != 2 || b.dim() != 2 || scale_a.dim() > 2 || scale_b.dim() > 2 || !a.is_cuda() ||
      !(aligned(a) && aligned(b) && aligned(scale_a) && aligned(scale_b) && aligned(bias))) {
    return call_door("scaled_mm", a, b, scale_a, scale_b, bias, table, dtype);
  }
  Signature sig;
  sig.add(-4);  // the scaled operator's signatures: never equal to another operator's of the same table key
  sig.add(a);
  sig.add(b);
  sig.add(scale_a);
  sig.add(scale_b);
  sig.add(bias);
  sig.add(static_cast<int64_t>(out_dtype));
  auto entry = entry_for("scaled_mm", table, sig, a, b, scale_a, scale_b, bias, table, dtype);
  const ProblemRange range(*entry);
  switch (entry->kind.load()) {
    case KERNEL: {
      bool ran = false;
      try {
        return dense("scaled_mm", *entry, a, b, out_dtype, bias, std::nullopt, &ran, scale_a, scale_b);
      } catch (const Refused& r) {
        refuse("scaled_mm", table, *entry, r.code);
      }
      break;
    }
    case TORCH:
      if (auto given = take_out(a.size(0), b.size(1), out_dtype, a.device())) {
        return at::_scaled_mm_out(*given, a, b, scale_a, scale_b, bias, std::nullopt, out_dtype, entry->fast_accum);
      }
      return at::_scaled_mm(a, b, scale_a, scale_b, bias, std::nullopt, out_dtype, entry->fast_accum);
    default:
      break;
  }
  return call_door("scaled_mm", a, b, scale_a, scale_b, bias, table, dtype);
}

at::Tensor door_grouped_mm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& offs, const std::string& table,
                           std::optional<at::ScalarType> out_dtype, bool keep_workspace, double min_ratio) {
  if (a.dim() != 2 || b.dim() != 3 || offs.dim() != 1 || !a.is_cuda() || !(aligned(a) && aligned(b))) {
    return call_door("grouped_mm door", a, b, offs, table, out_dtype, keep_workspace, min_ratio);
  }
  Signature sig;
  sig.add(a);
  sig.add(b);
  sig.add(offs);
  sig.add(out_dtype.has_value() ? static_cast<int64_t>(*out_dtype) : -1);
  sig.add(static_cast<int64_t>(keep_workspace));
  sig.add_real(min_ratio);
  auto entry = entry_for("grouped_mm door", table, sig, a, b, offs, table, out_dtype, keep_workspace, min_ratio);
  if (auto out = grouped_planned("grouped_mm", table, *entry, a, b, offs, out_dtype)) {
    return *out;
  }
  return call_door("grouped_mm door", a, b, offs, table, out_dtype, keep_workspace, min_ratio);
}

// The MoE layer's GLU stage (runtime/_moe_glu.py): act(gate) * up of routed rows `a` through the
// interleaved gate_up weights `b` (E x K x N, the transpose of the laid-out E x N x K) by the
// table's grouped GLU kernel, the result M x N/2; resolved once per signature as the doors are
// (min_ratio 0: the layer chose the stage by the table's figures), the rest in Python.
at::Tensor door_grouped_glu(const at::Tensor& a, const at::Tensor& b, const at::Tensor& offs, const std::string& table,
                            const std::string& activation) {
  if (a.dim() != 2 || b.dim() != 3 || offs.dim() != 1 || !a.is_cuda() || !(aligned(a) && aligned(b))) {
    return call_door("grouped_glu door", a, b, offs, table, activation);
  }
  Signature sig;
  sig.add(-2);  // the GLU door's signatures: never equal to another door's of the same table key
  sig.add(a);
  sig.add(b);
  sig.add(offs);
  sig.add(activation_id(activation));
  auto entry = entry_for("grouped_glu door", table, sig, a, b, offs, table, activation);
  if (auto out = grouped_planned("grouped_glu", table, *entry, a, b, offs, std::nullopt, true)) {
    return *out;
  }
  return call_door("grouped_glu door", a, b, offs, table, activation);
}

#else  // no CUDA in this torch: CUDA tensors cannot exist, and the Python door takes any that might

at::Tensor door_matmul(const at::Tensor& a, const at::Tensor& b, const std::string& table,
                       std::optional<at::ScalarType> out_dtype, const std::optional<at::Tensor>& scale_a,
                       const std::optional<at::Tensor>& scale_b, double min_ratio) {
  return call_door("matmul", a, b, table, out_dtype, scale_a, scale_b, min_ratio);
}

at::Tensor door_grouped_mm(const at::Tensor& a, const at::Tensor& b, const at::Tensor& offs, const std::string& table,
                           std::optional<at::ScalarType> out_dtype, bool keep_workspace, double min_ratio) {
  return call_door("grouped_mm door", a, b, offs, table, out_dtype, keep_workspace, min_ratio);
}

at::Tensor door_grouped_glu(const at::Tensor& a, const at::Tensor& b, const at::Tensor& offs, const std::string& table,
                            const std::string& activation) {
  return call_door("grouped_glu door", a, b, offs, table, activation);
}

at::Tensor grouped_mm_cuda(const at::Tensor& a, const at::Tensor& b, const at::Tensor& offs, c10::string_view table,
                           std::optional<at::ScalarType> out_dtype) {
  return call_door("grouped_mm", a, b, offs, std::string(table), out_dtype);
}

at::Tensor mm_cuda(const at::Tensor& a, const at::Tensor& b, c10::string_view table,
                   std::optional<at::ScalarType> out_dtype) {
  return call_door("mm", a, b, std::string(table), out_dtype);
}

at::Tensor scaled_mm_cuda(const at::Tensor& a, const at::Tensor& b, const at::Tensor& scale_a, const at::Tensor& scale_b,
                          const std::optional<at::Tensor>& bias, c10::string_view table, at::ScalarType out_dtype) {
  return call_door("scaled_mm", a, b, scale_a, scale_b, bias, std::string(table),
                   std::optional<at::ScalarType>(out_dtype));
}

at::Tensor linear_cuda(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                       c10::string_view activation, c10::string_view table,
                       const std::optional<at::Tensor>& residual, const std::optional<at::Tensor>& gate) {
  return call_door("linear", x, weight, bias, std::string(activation), std::string(table), residual, gate);
}

#endif  // CUTLASS_TUNE_NATIVE_CUDA

// ---------------------------------------------------------------------------------------------
// Out variants: what Inductor calls in a compiled graph in place of the operators (an extern
// kernel with out=, runtime/_lowering.py): the operator's CUDA kernel, its result written into
// `out`, no dispatcher, no autograd layer and no output checks. A path that made a tensor of its
// own (the Python door, torch's grouped GEMM, linear's torch fallback) is copied into `out`.

struct OutTarget {
  explicit OutTarget(at::Tensor& out) { out_target = &out; }
  ~OutTarget() { out_target = nullptr; }
};

void into(at::Tensor& out, const at::Tensor& result) {
  if (result.data_ptr() != out.data_ptr()) {
    out.copy_(result.reshape(out.sizes()));
  }
}

void mm_out(const at::Tensor& a, const at::Tensor& b, const std::string& table, std::optional<at::ScalarType> out_dtype,
            at::Tensor out) {
  const OutTarget target(out);
  into(out, mm_cuda(a, b, table, out_dtype));
}

void linear_out(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                const std::string& activation, const std::string& table, const std::optional<at::Tensor>& residual,
                const std::optional<at::Tensor>& gate, at::Tensor out) {
  const OutTarget target(out);
  into(out, linear_cuda(x, weight, bias, activation, table, residual, gate));
}

void grouped_mm_out(const at::Tensor& a, const at::Tensor& b, const at::Tensor& offs, const std::string& table,
                    std::optional<at::ScalarType> out_dtype, at::Tensor out) {
  const OutTarget target(out);
  into(out, grouped_mm_cuda(a, b, offs, table, out_dtype));
}

void scaled_mm_out(const at::Tensor& a, const at::Tensor& b, const at::Tensor& scale_a, const at::Tensor& scale_b,
                   const std::optional<at::Tensor>& bias, const std::string& table, at::ScalarType out_dtype,
                   at::Tensor out) {
  const OutTarget target(out);
  into(out, scaled_mm_cuda(a, b, scale_a, scale_b, bias, table, out_dtype));
}

#if CUTLASS_TUNE_NATIVE_CUDA

// The GLU stage's door (`door_grouped_glu`) writing into `out`: the MoE layer's GLU operator's
// extern kernel calls it (runtime/_moe_glu.py, `gate_up_glu_into`).
void grouped_glu_out(const at::Tensor& a, const at::Tensor& b, const at::Tensor& offs, const std::string& table,
                     const std::string& activation, at::Tensor out) {
  const OutTarget target(out);
  into(out, door_grouped_glu(a, b, offs, table, activation));
}

}  // namespace cutlass_tune_native

namespace cutlass_tune_moe {
void rows_into(bool combine, const at::Tensor& in, const at::Tensor& inv, const c10::optional<at::Tensor>& weights,
               int64_t top_k, at::Tensor& out);  // moe.cu
}  // namespace cutlass_tune_moe

namespace __attribute__((visibility("hidden"))) cutlass_tune_native {

// moe.cu's gather and combine writing into `out` (no dispatcher: the kernels below the operators).
void moe_gather_out(const at::Tensor& x, const at::Tensor& inv, const std::optional<at::Tensor>& weights, int64_t top_k,
                    at::Tensor out) {
  cutlass_tune_moe::rows_into(false, x, inv, weights, top_k, out);
}

void moe_combine_out(const at::Tensor& y, const at::Tensor& inv, const std::optional<at::Tensor>& weights,
                     int64_t top_k, at::Tensor out) {
  cutlass_tune_moe::rows_into(true, y, inv, weights, top_k, out);
}

#endif  // CUTLASS_TUNE_NATIVE_CUDA

// ---------------------------------------------------------------------------------------------
// Autograd: below autograd at C++ cost where no gradient is needed; where one is, a C++ autograd
// Function whose forward runs the operator below autograd and whose backward is the Python
// formula's (runtime/_op.py's `_backward`, `_linear_backward`, runtime/_grouped_op.py's
// `_backward`) in C++: the gradient GEMMs through the operators themselves, so the table's
// kernels serve the backward too. The Python formula runs only for an activation C++ does not
// know (`activation_kind`), which a newer Python side may name.

bool needs_grad(std::initializer_list<const at::Tensor*> tensors) {
  if (!c10::GradMode::is_enabled()) {
    return false;
  }
  for (const at::Tensor* t : tensors) {
    if (t != nullptr && t->defined() && t->requires_grad()) {
      return true;
    }
  }
  return false;
}

const at::Tensor* maybe(const std::optional<at::Tensor>& t) { return t.has_value() ? &*t : nullptr; }

using MmOp = at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view, std::optional<at::ScalarType>);
using LinearOp = at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, c10::string_view,
                            c10::string_view, const std::optional<at::Tensor>&, const std::optional<at::Tensor>&);
using GroupedOp = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, c10::string_view,
                             std::optional<at::ScalarType>);

const c10::TypedOperatorHandle<MmOp>& mm_op() {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("cutlass_tune::mm", "").typed<MmOp>();
  return op;
}

const c10::TypedOperatorHandle<LinearOp>& linear_op() {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("cutlass_tune::linear", "").typed<LinearOp>();
  return op;
}

const c10::TypedOperatorHandle<GroupedOp>& grouped_mm_op() {
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("cutlass_tune::grouped_mm", "").typed<GroupedOp>();
  return op;
}

// The operator `mm` as Python's `mm(...)` calls it in a backward: through autograd (which records
// the gradient GEMMs only under create_graph).
at::Tensor mm(const at::Tensor& a, const at::Tensor& b, const std::string& table) {
  return mm_op().call(a, b, table, std::nullopt);
}

// A 2-D tensor stored transposed (the `weight.t()` of nn.Linear): _op._column_major.
bool column_major(const at::Tensor& t) { return t.dim() == 2 && !t.is_contiguous() && t.t().is_contiguous(); }

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct MmFunction : public torch::autograd::Function<MmFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b, c10::string_view table,
                            std::optional<at::ScalarType> out_dtype) {
    at::Tensor out;
    {
      at::AutoDispatchBelowADInplaceOrView below;
      out = mm_op().call(a, b, table, out_dtype);
    }
    const bool needs_a = ctx->needs_input_grad(0), needs_b = ctx->needs_input_grad(1);
    ctx->save_for_backward({needs_b ? a : at::Tensor(), needs_a ? b : at::Tensor()});  // each needs the other
    ctx->saved_data["table"] = std::string(table);
    ctx->saved_data["dtype"] = static_cast<int64_t>(a.scalar_type());
    ctx->saved_data["a_column_major"] = column_major(a);
    ctx->saved_data["b_column_major"] = column_major(b);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    TORCH_CHECK_NOT_IMPLEMENTED(!fp8(dtype), "cutlass_tune.mm has no backward for fp8 inputs (they need scaling)");
    auto saved = ctx->get_saved_variables();
    const at::Tensor& a = saved[0];
    const at::Tensor& b = saved[1];
    const std::string table = ctx->saved_data["table"].toStringRef();
    // A result of another type (out_dtype) gives gradients of the inputs' type; contiguous, as an
    // expanded gradient (of a sum) is neither row- nor column-major.
    const at::Tensor grad = grads[0].to(dtype).contiguous();
    at::Tensor grad_a, grad_b;
    if (ctx->needs_input_grad(0)) {  // dA = dY @ B^T in a's layout
      grad_a = ctx->saved_data["a_column_major"].toBool() ? mm(b, grad.t(), table).t() : mm(grad, b.t(), table);
    }
    if (ctx->needs_input_grad(1)) {  // dB = A^T @ dY over the flattened batch, in b's layout
      const at::Tensor a2 = a.reshape({-1, a.size(-1)}), grad2 = grad.reshape({-1, grad.size(-1)});
      grad_b = ctx->saved_data["b_column_major"].toBool() ? mm(grad2.t(), a2, table).t() : mm(a2.t(), grad2, table);
    }
    return {grad_a, grad_b, at::Tensor(), at::Tensor()};
  }
};

struct LinearFunction : public torch::autograd::Function<LinearFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias, c10::string_view activation,
                            c10::string_view table, const std::optional<at::Tensor>& residual,
                            const std::optional<at::Tensor>& gate) {
    at::Tensor out;
    {
      at::AutoDispatchBelowADInplaceOrView below;
      out = linear_op().call(x, weight, bias, activation, table, residual, gate);
    }
    const ActivationKind act = activation_kind(activation);
    // A residual is needed again only to recompute an activation's input; a gate always is.
    at::Tensor keep_residual = residual.has_value() && act != ACT_NONE ? *residual : at::Tensor();
    ctx->save_for_backward({x, weight, bias.value_or(at::Tensor()), keep_residual, gate.value_or(at::Tensor())});
    // The autograd edges are the tensors given, in order: x, weight, then bias, residual, gate where given.
    int64_t edge = 2;
    for (const char* name : {"bias", "residual", "gate"}) {
      const auto& t = name[0] == 'b' ? bias : name[0] == 'r' ? residual : gate;
      ctx->saved_data[name] = t.has_value() && t->defined() ? edge++ : int64_t{-1};
    }
    ctx->saved_data["activation"] = static_cast<int64_t>(act);
    ctx->saved_data["table"] = std::string(table);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1], &bias = saved[2], &residual = saved[3], &gate = saved[4];
    const auto act = static_cast<ActivationKind>(ctx->saved_data["activation"].toInt());
    const std::string table = ctx->saved_data["table"].toStringRef();
    auto needs = [&](const char* name) {
      const int64_t edge = ctx->saved_data[name].toInt();
      return edge >= 0 && ctx->needs_input_grad(static_cast<size_t>(edge));
    };
    at::Tensor grad = grads[0].contiguous();
    // The fused kernel kept no x @ weight^T + bias: recomputed with `mm` where a node needs it.
    auto product = [&] {
      at::Tensor z = mm(x, weight.t(), table);
      return bias.defined() ? z + bias : z;
    };
    // The epilogue's nodes after the bias, last first (_torch.NODE_GRAD): a gate's, or an
    // activation's over the residual's sum (the residual passes the gradient on).
    at::Tensor grad_gate;
    if (gate.defined()) {
      if (needs("gate")) {
        const at::Tensor g = grad * product();
        grad_gate = (act == ACT_NONE ? g : activation_grad(act, g, gate)).contiguous();
      }
      grad = grad * activate(act, gate);
    } else if (act != ACT_NONE) {
      at::Tensor z = product();
      if (residual.defined()) {
        z = at::add(z, residual);
      }
      grad = activation_grad(act, grad, z);
    }
    grad = grad.contiguous();
    at::Tensor grad_x, grad_weight, grad_bias, grad_residual;
    if (ctx->needs_input_grad(0)) {
      grad_x = mm(grad, weight, table);  // dY @ (weight^T)^T
    }
    const at::Tensor grad2 = grad.reshape({-1, grad.size(-1)});
    if (ctx->needs_input_grad(1)) {
      grad_weight = mm(grad2.t(), x.reshape({-1, x.size(-1)}), table);  // N x K like the weight
    }
    if (needs("bias")) {
      grad_bias = grad2.sum(0);
    }
    if (needs("residual")) {
      grad_residual = grad;
    }
    return {grad_x, grad_weight, grad_bias, at::Tensor(), at::Tensor(), grad_residual, grad_gate};
  }
};

using WeightGradOp = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, c10::string_view);

// dW_e = g_e^T x_e (E x N x K): the operator cutlass_tune::grouped_weight_grad, which
// runtime/_grouped_op.py defines (a Python CUDA kernel: the table's tuned weight-gradient kernels),
// through the dispatcher, so torch.compile traces it; torch's grouped GEMM where that module has not
// defined it in this process.
at::Tensor weight_grad(const at::Tensor& g, const at::Tensor& x, const at::Tensor& offs, const std::string& table) {
  static std::optional<c10::TypedOperatorHandle<WeightGradOp>> op;
  static std::mutex lock;
  {
    std::lock_guard<std::mutex> guard(lock);
    if (!op.has_value()) {
      if (auto found = c10::Dispatcher::singleton().findSchema({"cutlass_tune::grouped_weight_grad", ""})) {
        op = found->typed<WeightGradOp>();
      }
    }
  }
  return op.has_value() ? op->call(g, x, offs, table) : at::_grouped_mm(g.t(), x, offs);
}

// b is the transpose(-2, -1) of a contiguous E x N x K stack (_grouped_op._weights_view).
bool weights_view(const at::Tensor& b) { return !b.is_contiguous() && b.transpose(-2, -1).is_contiguous(); }

struct GroupedMmFunction : public torch::autograd::Function<GroupedMmFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b, const at::Tensor& offs,
                            c10::string_view table, std::optional<at::ScalarType> out_dtype) {
    at::Tensor out;
    {
      at::AutoDispatchBelowADInplaceOrView below;
      out = grouped_mm_op().call(a, b, offs, table, out_dtype);
    }
    const bool needs_a = ctx->needs_input_grad(0), needs_b = ctx->needs_input_grad(1);
    ctx->save_for_backward({needs_b ? a : at::Tensor(), needs_a ? b : at::Tensor(), offs});
    ctx->saved_data["table"] = std::string(table);
    ctx->saved_data["dtype"] = static_cast<int64_t>(a.scalar_type());
    ctx->saved_data["weights_view"] = weights_view(b);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor &a = saved[0], &b = saved[1], &offs = saved[2];
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    const at::Tensor grad = grads[0].to(dtype).contiguous();
    at::Tensor grad_a, grad_b;
    if (ctx->needs_input_grad(0)) {  // dA = dY @ B_e^T: the operator on the other layout of B
      grad_a = grouped_mm_op().call(grad, b.transpose(-2, -1), offs, ctx->saved_data["table"].toStringRef(),
                                    std::nullopt);
    }
    if (ctx->needs_input_grad(1)) {  // dB_e = A_e^T @ dY_e by the weight-gradient operator, in b's layout
      const std::string table = ctx->saved_data["table"].toStringRef();
      grad_b = ctx->saved_data["weights_view"].toBool() ? weight_grad(grad, a, offs, table).transpose(-2, -1)
                                                        : weight_grad(a, grad, offs, table);
    }
    return {grad_a, grad_b, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor grouped_mm_autograd(const at::Tensor& a, const at::Tensor& b, const at::Tensor& offs,
                               c10::string_view table, std::optional<at::ScalarType> out_dtype) {
  if (!needs_grad({&a, &b})) {
    at::AutoDispatchBelowADInplaceOrView below;
    return grouped_mm_op().call(a, b, offs, table, out_dtype);
  }
  return GroupedMmFunction::apply(a, b, offs, table, out_dtype);
}

#if CUTLASS_TUNE_NATIVE_CUDA

// The MoE glue's operators (moe.cu, built with the .cu sources): gather and combine are each
// other's adjoint, and the routing weights' gradient of either is moe_weights_grad with the
// token-side tensor first. runtime/_moe_routing.py's `_setup` and `_op_backward` in C++, so a
// call pays no Python autograd kernel (the Python formula registers only where this does not).
using MoeRowsOp = at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, int64_t);
using MoeWeightsGradOp = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t);

const c10::TypedOperatorHandle<MoeRowsOp>& moe_rows_op(bool combine) {
  static auto gather =
      c10::Dispatcher::singleton().findSchemaOrThrow("cutlass_tune::moe_gather", "").typed<MoeRowsOp>();
  static auto combine_op =
      c10::Dispatcher::singleton().findSchemaOrThrow("cutlass_tune::moe_combine", "").typed<MoeRowsOp>();
  return combine ? combine_op : gather;
}

const c10::TypedOperatorHandle<MoeWeightsGradOp>& moe_weights_grad_op() {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("cutlass_tune::moe_weights_grad", "")
                       .typed<MoeWeightsGradOp>();
  return op;
}

// The gather (`combine` false) or the combine of rows; edges x (or y), inv, then weights where given.
template <bool COMBINE>
struct MoeRowsFunction : public torch::autograd::Function<MoeRowsFunction<COMBINE>> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& inv,
                            const std::optional<at::Tensor>& weights, int64_t top_k) {
    at::Tensor out;
    {
      at::AutoDispatchBelowADInplaceOrView below;
      out = moe_rows_op(COMBINE).call(x, inv, weights, top_k);
    }
    const bool weighted = weights.has_value() && weights->defined();
    // x is needed again only for the weights' gradient.
    ctx->save_for_backward({weighted && ctx->needs_input_grad(2) ? x : at::Tensor(), inv,
                            weighted ? *weights : at::Tensor()});
    ctx->saved_data["top_k"] = top_k;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &inv = saved[1], &weights = saved[2];
    const int64_t top_k = ctx->saved_data["top_k"].toInt();
    const at::Tensor grad = grads[0].contiguous();
    at::Tensor grad_x, grad_weights;
    if (ctx->needs_input_grad(0)) {  // the adjoint: a gather's is a combine, a combine's a gather
      grad_x = moe_rows_op(!COMBINE).call(grad, inv, weights.defined() ? std::optional<at::Tensor>(weights)
                                                                       : std::nullopt, top_k);
    }
    if (x.defined()) {  // <token row, routed row>
      grad_weights = COMBINE ? moe_weights_grad_op().call(grad, x, inv, top_k)
                             : moe_weights_grad_op().call(x, grad, inv, top_k);
    }
    return {grad_x, at::Tensor(), grad_weights, at::Tensor()};
  }
};

template <bool COMBINE>
at::Tensor moe_rows_autograd(const at::Tensor& x, const at::Tensor& inv, const std::optional<at::Tensor>& weights,
                             int64_t top_k) {
  if (!needs_grad({&x, maybe(weights)})) {
    at::AutoDispatchBelowADInplaceOrView below;
    return moe_rows_op(COMBINE).call(x, inv, weights, top_k);
  }
  return MoeRowsFunction<COMBINE>::apply(x, inv, weights, top_k);
}

#endif  // CUTLASS_TUNE_NATIVE_CUDA

at::Tensor mm_autograd(const at::Tensor& a, const at::Tensor& b, c10::string_view table,
                       std::optional<at::ScalarType> out_dtype) {
  if (!needs_grad({&a, &b})) {
    at::AutoDispatchBelowADInplaceOrView below;
    return mm_op().call(a, b, table, out_dtype);
  }
  return MmFunction::apply(a, b, table, out_dtype);
}

at::Tensor linear_autograd(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                           c10::string_view activation, c10::string_view table,
                           const std::optional<at::Tensor>& residual, const std::optional<at::Tensor>& gate) {
  if (!needs_grad({&x, &weight, maybe(bias), maybe(residual), maybe(gate)})) {
    at::AutoDispatchBelowADInplaceOrView below;
    return linear_op().call(x, weight, bias, activation, table, residual, gate);
  }
  if (activation_kind(activation) == ACT_UNKNOWN) {  // the Python formula (it also names a bad activation)
    return call_autograd("linear", x, weight, bias, std::string(activation), std::string(table), residual, gate);
  }
  return LinearFunction::apply(x, weight, bias, activation, table, residual, gate);
}

std::vector<at::Tag> tags() {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 8)
  // Inductor hands the operators their operands with eager strides: a kernel is picked by layout.
  return {at::Tag::pt2_compliant_tag, at::Tag::needs_exact_strides};
#else
  return {at::Tag::pt2_compliant_tag};
#endif
}

}  // namespace cutlass_tune_native

TORCH_LIBRARY_FRAGMENT(cutlass_tune, m) {
  using namespace cutlass_tune_native;
  m.def(torch::schema("mm(Tensor a, Tensor b, str table, ScalarType? out_dtype=None) -> Tensor"), tags(), torch::_RegisterOrVerify::REGISTER);
  m.def(torch::schema("linear(Tensor x, Tensor weight, Tensor? bias, str activation, str table, "
                      "Tensor? residual=None, Tensor? gate=None) -> Tensor"),
        tags(), torch::_RegisterOrVerify::REGISTER);
  m.def(torch::schema("grouped_mm(Tensor a, Tensor b, Tensor offs, str table, ScalarType? out_dtype=None) -> Tensor"),
        tags(), torch::_RegisterOrVerify::REGISTER);
  // Forward only (fp8 operands take no gradient): no Autograd kernel.
  m.def(torch::schema("scaled_mm(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b, Tensor? bias, str table, "
                      "ScalarType out_dtype) -> Tensor"),
        tags(), torch::_RegisterOrVerify::REGISTER);
}

TORCH_LIBRARY_IMPL(cutlass_tune, Autograd, m) {
  m.impl("mm", &cutlass_tune_native::mm_autograd);
  m.impl("linear", &cutlass_tune_native::linear_autograd);
  m.impl("grouped_mm", &cutlass_tune_native::grouped_mm_autograd);
#if CUTLASS_TUNE_NATIVE_CUDA
  // Their schemas and CUDA kernels are moe.cu's.
  m.impl("moe_gather", &cutlass_tune_native::moe_rows_autograd<false>);
  m.impl("moe_combine", &cutlass_tune_native::moe_rows_autograd<true>);
#endif
}

TORCH_LIBRARY_IMPL(cutlass_tune, CUDA, m) {
  m.impl("mm", &cutlass_tune_native::mm_cuda);
  m.impl("linear", &cutlass_tune_native::linear_cuda);
  m.impl("grouped_mm", &cutlass_tune_native::grouped_mm_cuda);
  m.impl("scaled_mm", &cutlass_tune_native::scaled_mm_cuda);
}

PYBIND11_MODULE(cutlass_tune_native, m) {
  using namespace cutlass_tune_native;
  m.doc() = "The cutlass_tune operators in C++ (cutlass_tune/native/ops.cpp).";
  m.attr("cuda") = py::bool_(CUTLASS_TUNE_NATIVE_CUDA != 0);
  m.def(
      "attach",
      [](py::object resolve, py::object door, py::object autograd, py::object refused, py::object may_keep) {
        Hooks* h = hooks();
        h->resolve = std::move(resolve);
        h->door = std::move(door);
        h->autograd = std::move(autograd);
        h->refused = std::move(refused);
        h->may_keep = std::move(may_keep);
      },
      "Attach the Python side: the resolver, the Python doors, the autograd formulas, and the hooks "
      "for a refused kernel and for keeping a workspace.");
  m.def(
      "forget",
      [](const std::optional<std::string>& table) {
        auto* t = tables();
        std::unique_lock<std::shared_mutex> lock(t->mu);
        if (table.has_value()) {
          t->plans.erase(*table);
        } else {
          t->plans.clear();
        }
      },
      py::arg("table") = py::none(), "Forget the plans of a table key or plan set (all: None).");
  m.def(
      "bind",
      [](const std::string& table, const std::string& set) {
        auto* t = tables();
        std::unique_lock<std::shared_mutex> lock(t->mu);
        t->bound[table] = set;
      },
      py::arg("table"), py::arg("set"),
      "Bind an operator's table key to a plan set (the bound table's own): the key's calls find and "
      "keep their plans there from now on.");
  m.def(
      "plans",
      [](const std::string& table) {
        auto* t = tables();
        std::shared_lock<std::shared_mutex> lock(t->mu);
        auto found = t->plans.find(plan_set(t, table));
        std::vector<int> kinds;
        if (found != t->plans.end()) {
          for (const auto& item : found->second) {
            kinds.push_back(item.second->kind.load());
          }
        }
        return kinds;
      },
      "The kinds of the plans held for a table key (0 Python, 1 torch, 2 empty, 3 kernel).");
  m.def("matmul", &door_matmul, py::arg("a"), py::arg("b"), py::arg("table"), py::arg("out_dtype"),
        py::arg("scale_a"), py::arg("scale_b"), py::arg("min_ratio"),
        "cutlass_tune.matmul's native path (runtime/_matmul.py): a @ b by the plan of the door's table key.");
  m.def("grouped_mm", &door_grouped_mm, py::arg("a"), py::arg("b"), py::arg("offs"), py::arg("table"),
        py::arg("out_dtype"), py::arg("keep_workspace"), py::arg("min_ratio"),
        "cutlass_tune.grouped_mm's native path (runtime/_grouped.py), by the plan of the door's table key.");
  m.def("grouped_glu", &door_grouped_glu, py::arg("a"), py::arg("b"), py::arg("offs"), py::arg("table"),
        py::arg("activation"),
        "The MoE layer's GLU stage's native path (runtime/_moe_glu.py): act(gate) * up by the grouped GLU "
        "kernel of the door's table key.");
  m.def("mm_out", &mm_out, py::arg("a"), py::arg("b"), py::arg("table"), py::arg("out_dtype"),
        py::arg("out"),
        "`mm` writing its result into `out` (Inductor's extern kernel, called positionally: pybind's keyword "
        "matching costs about a microsecond a call; runtime/_lowering.py).");
  m.def("linear_out", &linear_out, py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("activation"),
        py::arg("table"), py::arg("residual"), py::arg("gate"), py::arg("out"),
        "`linear` writing its result into `out`.");
  m.def("grouped_mm_out", &grouped_mm_out, py::arg("a"), py::arg("b"), py::arg("offs"), py::arg("table"),
        py::arg("out_dtype"), py::arg("out"), "`grouped_mm` writing its result into `out`.");
  m.def("scaled_mm_out", &scaled_mm_out, py::arg("a"), py::arg("b"), py::arg("scale_a"), py::arg("scale_b"),
        py::arg("bias"), py::arg("table"), py::arg("out_dtype"), py::arg("out"),
        "`scaled_mm` writing its result into `out`.");
#if CUTLASS_TUNE_NATIVE_CUDA
  m.def("grouped_glu_out", &grouped_glu_out, py::arg("a"), py::arg("b"), py::arg("offs"), py::arg("table"),
        py::arg("activation"), py::arg("out"), "The GLU stage's door writing its result into `out`.");
  m.def("moe_gather_out", &moe_gather_out, py::arg("x"), py::arg("inv"), py::arg("weights"), py::arg("top_k"),
        py::arg("out"), "`moe_gather` writing its routed rows into `out`.");
  m.def("moe_combine_out", &moe_combine_out, py::arg("y"), py::arg("inv"), py::arg("weights"), py::arg("top_k"),
        py::arg("out"), "`moe_combine` writing its token rows into `out`.");
#endif
  m.def(
      "hook_calls",
      [] {
        py::dict out;
        out["resolve"] = py::int_(hook_calls()->resolve.load());
        out["door"] = py::int_(hook_calls()->door.load());
        out["autograd"] = py::int_(hook_calls()->autograd.load());
        return out;
      },
      "How often the operators called each Python hook since the library loaded: resolve (once per "
      "new signature), door, autograd.");
  m.def("args_layout", [] {
    py::dict out;
#define CT_FIELD(f) out[#f] = py::int_(offsetof(cutlass_tune_args, f))
    CT_FIELD(m); CT_FIELD(n); CT_FIELD(k); CT_FIELD(a); CT_FIELD(b); CT_FIELD(c); CT_FIELD(d);
    CT_FIELD(alpha); CT_FIELD(beta); CT_FIELD(raster); CT_FIELD(swizzle); CT_FIELD(splits);
    CT_FIELD(decomposition); CT_FIELD(device_id); CT_FIELD(sm_count); CT_FIELD(bias); CT_FIELD(scale_a);
    CT_FIELD(scale_b); CT_FIELD(groups); CT_FIELD(offsets);
#undef CT_FIELD
    out["sizeof"] = py::int_(sizeof(cutlass_tune_args));
    return out;
  }, "Field offsets of struct cutlass_tune_args as this module sees it, and its size.");
}
