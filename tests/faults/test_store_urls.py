"""Storage URLs that do not parse, name no driver or no server: one line, exit 2, no password."""

from pathlib import Path

import pytest

from cutlass_tune.store import ResultStore, StoreError, shown_url

from ..cli_run import cli

SECRET = "S3cret"
QUICK = Path(__file__).resolve().parents[2] / "configs" / "quick.yaml"
URLS = [
    pytest.param(f"postgresql+psycopg2://u:{SECRET}@127.0.0.1:1/db", id="no-driver"),
    pytest.param(f"postgresql+psycopg://u:{SECRET}@host:notaport/db", id="port-not-a-number"),
    pytest.param(f"nosuch://u:{SECRET}@h/db", id="unknown-dialect"),
    pytest.param(f"postgresql+psycopg://u:{SECRET}@127.0.0.1:1/db", id="unreachable"),
    # Regression: a password in the query, which psycopg takes as well, was printed as it was.
    pytest.param(f"postgresql+psycopg://u@127.0.0.1:1/db?sslmode=disable&password={SECRET}", id="password-in-query"),
    pytest.param(f"postgresql+psycopg://u@h:notaport/db?sslpassword={SECRET}", id="sslpassword-in-query"),
]


@pytest.mark.parametrize("url", URLS)
def test_the_store_refuses_in_one_line_without_the_password(url):
    # Regression: "no driver" and "cannot parse" printed the password; a bad port was a ValueError.
    with pytest.raises(StoreError) as info:
        ResultStore(url)
    assert "\n" not in str(info.value) and SECRET not in str(info.value)
    assert "***" in str(info.value)


@pytest.mark.parametrize("command", [["best"], ["dashboard", "-o", "{tmp}/d.html"], ["export", "-o", "{tmp}/b"],
                                     ["confirm"], ["upgrade"], ["sweep", str(QUICK)]], ids=lambda c: c[0])
@pytest.mark.parametrize("url", URLS[:2] + URLS[-2:])
def test_every_reading_command_gives_one_line_and_exit_2(command, url, tmp_path):
    args = [a.format(tmp=tmp_path) for a in command]
    done = cli(*args, "--storage", url, cwd=Path.cwd())  # in this process: its output and exit code
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert SECRET not in done.stderr + done.stdout
    assert not (tmp_path / "d.html").exists() and not (tmp_path / "b").exists()


def test_load_best_raises_the_store_error():
    import cutlass_tune

    with pytest.raises(StoreError, match="port") as info:
        cutlass_tune.load_best(f"postgresql+psycopg://u:{SECRET}@host:notaport/db")
    assert SECRET not in str(info.value)


@pytest.mark.parametrize("url,shown", [
    ("postgresql+psycopg://u:pw@h:5432/db", "postgresql+psycopg://u:***@h:5432/db"),
    ("postgresql+psycopg://u:pw@h:notaport/db", "postgresql+psycopg://u:***@h:notaport/db"),
    ("sqlite:///results/x.sqlite", "sqlite:///results/x.sqlite"),
    ("postgresql+psycopg://u@h/db", "postgresql+psycopg://u@h/db"),
    ("postgresql+psycopg://u@h/db?password=pw&sslmode=require", "postgresql+psycopg://u@h/db?password=***&sslmode=require"),
    ("postgresql+psycopg://u@h:x/db?sslpassword=pw", "postgresql+psycopg://u@h:x/db?sslpassword=***"),
])
def test_shown_url_masks_the_password_even_where_it_cannot_parse(url, shown):
    assert shown_url(url) == shown


@pytest.mark.parametrize("url", ["postgresql+psycopg://u:p@ss@127.0.0.1:1/db", "postgresql+psycopg://u:p@ss@host:x/db",
                                 "postgresql+psycopg://u:p@s@s@127.0.0.1:1/db"])
def test_a_raw_at_sign_in_the_password_shows_none_of_it(url):
    # Regression: SQLAlchemy took `ss@host` for the host, so errors printed the password's tail `ss`.
    with pytest.raises(StoreError) as info:
        ResultStore(url)
    message = str(info.value)
    assert "ss" not in message and "s@" not in message and "u:***@" in message and "\n" not in message, message
    assert "ss" not in shown_url(url)
