"""What the README tells a new user holds: the extras it names install what its commands need, and
its headline table says how the committed store behind it was timed."""

import re
from pathlib import Path

import pytest

from cutlass_tune import settings
from cutlass_tune.measurement import TimingMethod
from cutlass_tune.store import open_store

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def test_every_extra_the_readme_names_exists():
    named = set(re.findall(r"'\.\[(\w+)\]'", README))
    assert named and named <= set(EXTRAS), sorted(named - set(EXTRAS))


def test_shapes_on_the_readme_s_model_names_the_extra_that_installs_transformers():
    # Regression: `cutlass-tune shapes benchmarks/models/llama.py:...` needs transformers, which no extra
    # named in the README installed.
    lines = [line for line in README.splitlines() if "cutlass-tune shapes benchmarks/models/" in line]
    assert lines
    for line in lines:
        (extra,) = re.findall(r"'\.\[(\w+)\]'", line)
        assert any(d.startswith("transformers") for d in EXTRAS[extra])


def test_the_headline_table_says_the_timing_method_of_its_store():
    # Regression: the table did not say its figures were single launches (`events`), which read up to 8% high.
    intro = " ".join(README[:README.index("| problem |")].split())
    assert settings.DEFAULT_STORE in intro
    scheme = open_store(settings.DEFAULT_STORE).timing()
    assert scheme is not None and scheme.method is TimingMethod.EVENTS and scheme.paired
    assert "`--method events`" in intro and "timed by single launches" in intro
    assert "sampled alternately on the same operands" in " ".join(README.split())  # paired


def test_the_test_extra_installs_every_other_extra():
    # Regression: CI installed `.[test]` without transformers, so the MoE-integration tests skipped there.
    test = set(EXTRAS["test"])
    for extra, requirements in EXTRAS.items():
        assert set(requirements) <= test, (extra, sorted(set(requirements) - test))


def test_ci_installs_and_runs_the_tests_as_the_readme_says():
    ci = (ROOT / ".ci" / "run").read_text()
    test = README[README.index("## Test"):]
    (install,) = re.findall(r"pip install -e '\.\[[\w,]+\]'", ci)
    assert install in test and "'.[test]'" in install
    assert re.search(r"^python3 -m pytest$", ci, re.MULTILINE) and ".ci/run" in test


DOCS = sorted((ROOT / "docs").glob("*.md"))


def test_the_readme_stays_the_short_front_door():
    # Regression: the README had grown to 1,860 words with a 250-word paragraph; the rest lives in docs/.
    assert len(README.split()) <= 900
    paragraphs = [p for p in re.split(r"\n\s*\n", README) if not p.lstrip().startswith(("|", "    ", "```"))]
    assert max(len(p.split()) for p in paragraphs) <= 120


@pytest.mark.parametrize("page", [ROOT / "README.md", *DOCS], ids=lambda p: p.name)
def test_every_command_a_page_shows_exists(page):
    from cutlass_tune.cli import app

    commands = {c.name or c.callback.__name__ for c in app.registered_commands}
    # A command line (an indented block) or `cutlass-tune X` in code, not the name in prose.
    shown = set(re.findall(r"(?:^ {4}|`)cutlass-tune (?:-\w+ )*([a-z][a-z_-]+)", page.read_text(), re.MULTILINE))
    assert shown - {"COMMAND"} <= commands, sorted(shown - commands)


@pytest.mark.parametrize("page", [ROOT / "README.md", *DOCS], ids=lambda p: p.name)
def test_every_file_a_page_links_exists(page):
    links = [t for t in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", page.read_text()) if "://" not in t]
    missing = [t for t in links if not (page.parent / t).exists()]
    assert not missing, missing
