"""The Makefile is the front door: every ``make <target>`` the README or docs/ names has a recipe.

Each target is checked with ``make -n`` (print the recipe, run nothing). ``make -n`` still runs
three things: ``$(shell ...)`` while parsing, recipe lines that use ``$(MAKE)``, and recipe lines
marked ``+``. :func:`test_make_n_runs_nothing_but_harmless_shell_lookups` holds the Makefile to
none of the last two and to ``$(shell command -v ...)`` lookups only, so the dry runs here never
install, start or benchmark anything.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAKEFILE = ROOT / "Makefile"
README = ROOT / "README.md"
#: make's own variables in the environment of a parent make (``make test`` runs pytest): a dry
#: run must not inherit its flags or job server.
PARENT_MAKE_VARS = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "MAKE_TERMOUT")


def readme_make_commands(text: str) -> list[tuple[str, tuple[str, ...]]]:
    """``(target, ("VAR=value", ...))`` for every ``make`` command in ``text``.

    Commands are read from fenced code blocks (one per line, comments dropped) and from inline
    code spans. A placeholder such as ``bench-<name>`` is expanded with the backticked names in
    the parentheses that follow its span (``make bench-<name>` (`dataplane`, `ebpf`, ...)``).
    """
    commands: list[str] = []
    in_block = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            in_block = not in_block
            continue
        if in_block:
            code = line.split("#", 1)[0].strip().removeprefix("$ ")
            if code.startswith("make "):
                commands.append(code)
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    for span in re.finditer(r"`(make [^`]+)`", prose):
        command = span.group(1).strip()
        if "<" not in command:
            commands.append(command)
            continue
        listed = re.match(r"[^(`]*\(([^);]*)", prose[span.end() :])
        names = re.findall(r"`([\w-]+)`", listed.group(1)) if listed else []
        assert names, f"README: no names listed after `{command}`"
        commands += [re.sub(r"<[^>]+>", n, command) for n in names]
    found: list[tuple[str, tuple[str, ...]]] = []
    for command in commands:
        words = command.split()[1:]
        variables = tuple(w for w in words if "=" in w)
        found += [(w, variables) for w in words if "=" not in w and not w.startswith("-")]
    return list(dict.fromkeys(found))


def dry_run(
    target: str, *variables: str, makefile: Path = MAKEFILE
) -> subprocess.CompletedProcess[str]:
    """``make -n target VARS`` in the repository root, outside any parent make."""
    env = {k: v for k, v in os.environ.items() if k not in PARENT_MAKE_VARS}
    return subprocess.run(
        ["make", "--no-print-directory", "-n", "-f", str(makefile), target, *variables],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )


def recipe_problem(res: subprocess.CompletedProcess[str]) -> str | None:
    """Why a dry run shows no recipe (``None`` when it shows one)."""
    if res.returncode != 0:
        return f"exit {res.returncode}: {res.stderr.strip()}"
    out = res.stdout.strip()
    # a .PHONY target whose rule make never looks at prints this and exits 0
    if not out or "Nothing to be done" in out or "is up to date" in out:
        return f"no recipe: {out or '(empty)'}"
    return None


#: README.md and the pages of docs/ (tests/docs/test_docs.py holds their other snippets)
COMMANDS = readme_make_commands(
    "\n".join(p.read_text() for p in [README, *sorted((ROOT / "docs").glob("*.md"))])
)


def test_readme_names_the_front_door_targets() -> None:
    targets = {t for t, _ in COMMANDS}
    assert {"demo", "test", "up", "down", "bench", "bench-dataplane", "lint", "chart"} <= targets


def test_readme_command_parser_reads_blocks_inline_spans_variables_and_placeholders() -> None:
    text = (
        "```sh\nmake up WITH=all   # comment with make down\n$ make lint\n```\n"
        "Use `make bench-<x>` (`a`, `b`; more) or `make status`.\n"
    )
    assert readme_make_commands(text) == [
        ("up", ("WITH=all",)),
        ("lint", ()),
        ("bench-a", ()),
        ("bench-b", ()),
        ("status", ()),
    ]


def test_make_n_runs_nothing_but_harmless_shell_lookups() -> None:
    text = MAKEFILE.read_text()
    assert "$(MAKE)" not in text and "${MAKE}" not in text, "make -n would run these lines"
    recipe_prefixes = re.findall(r"^\t([@+-]*)", text, flags=re.M)
    assert not [p for p in recipe_prefixes if "+" in p], "make -n runs `+` recipe lines"
    for call in re.findall(r"\$\(shell ([^)]*)\)", text):
        assert call.startswith("command -v "), f"make runs $(shell {call}) even with -n"


@pytest.mark.parametrize(
    ("target", "variables"), COMMANDS, ids=[" ".join((t, *v)) for t, v in COMMANDS]
)
def test_every_make_target_the_readme_names_has_a_recipe(
    target: str, variables: tuple[str, ...]
) -> None:
    assert recipe_problem(dry_run(target, *variables)) is None


def test_make_up_with_all_passes_the_parts_to_fedfaas_up() -> None:
    res = dry_run("up", "WITH=all")
    assert recipe_problem(res) is None
    assert re.search(r"fedfaas up --state-dir \S+ --with all$", res.stdout, flags=re.M)


def test_make_bench_dataplane_runs_the_dataplane_benchmark() -> None:
    # `bench-%` was a pattern rule for .PHONY targets: make skipped it and did nothing
    res = dry_run("bench-dataplane")
    assert recipe_problem(res) is None
    assert re.search(r"python -m bench\.dataplane$", res.stdout, flags=re.M), res.stdout
    assert (ROOT / "bench" / "dataplane.py").is_file()


def test_every_bench_the_makefile_lists_is_a_module_with_a_recipe() -> None:
    benches = re.search(r"^BENCHES\s*:?=(.*)$", MAKEFILE.read_text(), flags=re.M)
    assert benches is not None
    names = benches.group(1).split()
    assert {f"bench-{n}" for n in names} <= {t for t, _ in COMMANDS}, "README lists them all"
    for name in names:
        assert (ROOT / "bench" / f"{name}.py").is_file(), name
        res = dry_run(f"bench-{name}")
        assert recipe_problem(res) is None
        assert f"-m bench.{name}" in res.stdout


def test_test_all_runs_every_tier_even_after_one_fails_and_names_the_failed(
    tmp_path: Path,
) -> None:
    # a `make` that records its tier and fails test-slow
    out = _test_all(tmp_path, f'#!/bin/sh\necho "$2" >> {tmp_path}/ran\n[ "$2" != test-slow ]\n')
    assert out.returncode == 1
    ran = (tmp_path / "ran").read_text().split()
    tiers = [t for t in ran if t.startswith("test")]
    assert tiers == ["test", "test-slow", "test-containers", "test-k8s"]
    assert "test-all: failed: test-slow" in out.stderr


def _test_all(tmp_path: Path, make: str, **extra: str) -> subprocess.CompletedProcess[str]:
    """scripts/test-all.sh with ``make`` (a script's text) as the `make` first on the PATH, in
    ``tmp_path``; ``extra``: more environment."""
    fake = tmp_path / "make"
    fake.write_text(make)
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in PARENT_MAKE_VARS and k != "TIERS"}
    env["PATH"] = f"{tmp_path}:{env.get('PATH', '/usr/bin:/bin')}"
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / "test-all.sh")],
        capture_output=True, text=True, env={**env, **extra}, timeout=60,
    )  # fmt: skip


# a `make` that logs each target's start and end; k8s-binaries logs its CPU niceness, takes a
# second and exits $BUILD_RC; test-slow waits (up to {wait} tenths of a second) for the build to
# have started and fails without it, so the run passes only if the build runs beside it
_LOGGING_MAKE = """#!/bin/sh
log={tmp}/ran
echo "start $2" >> $log
case "$2" in
  k8s-binaries) echo "nice $(nice)" >> $log; sleep 1; echo "end $2" >> $log; exit $BUILD_RC ;;
  test-slow) i=0; until grep -q "start k8s-binaries" $log || [ $i -ge {wait} ]; do
      sleep 0.1; i=$((i + 1)); done
    grep -q "start k8s-binaries" $log || [ {wait} -eq 0 ] || exit 1 ;;
esac
echo "end $2" >> $log
"""


@pytest.mark.parametrize("build_rc", [0, 1])
def test_test_all_builds_the_k8s_binaries_beside_the_slow_tier_and_k8s_waits_for_them(
    tmp_path: Path, build_rc: int
) -> None:
    out = _test_all(tmp_path, _LOGGING_MAKE.format(tmp=tmp_path, wait=100), BUILD_RC=str(build_rc))
    log = (tmp_path / "ran").read_text().splitlines()
    # Chromium's apt-get (test-slow's prerequisite) is done before the build's apt-gets start
    assert log.index("end browser") < log.index("start k8s-binaries") < log.index("end test-slow")
    assert "nice 19" in log  # the tests come first
    assert log.count("start k8s-binaries") == 1  # once, not again for test-containers
    assert out.returncode == 0, out.stdout + out.stderr
    # test-k8s starts once the build has ended; one that failed is reported, and `make
    # test-k8s` (whose prerequisite k8s-binaries builds what is missing) decides the tier
    assert log.index("end k8s-binaries") < log.index("start test-k8s")
    assert f"make k8s-binaries (background): exit {build_rc}" in out.stdout


def test_test_all_builds_nothing_in_the_background_when_no_k8s_tier_follows(
    tmp_path: Path,
) -> None:
    make = _LOGGING_MAKE.format(tmp=tmp_path, wait=0)  # nothing to wait for
    out = _test_all(tmp_path, make, BUILD_RC="0", TIERS="test-k8s test-slow test-containers")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "start k8s-binaries" not in (tmp_path / "ran").read_text()


def test_make_bench_ends_by_checking_that_every_result_names_one_commit() -> None:
    res = dry_run("bench")
    assert recipe_problem(res) is None
    assert res.stdout.rstrip().splitlines()[-1].endswith("python -m bench.results_state")
    assert dry_run("bench-state").stdout.rstrip().endswith("python -m bench.results_state")


def test_the_scale_bench_runs_in_two_parts_merged_into_one_result() -> None:
    clients = dry_run("bench-scale-clients").stdout
    sizes = dry_run("bench-scale-sizes").stdout
    assert re.search(r"python -m bench\.scale --sizes-mb ''$", clients, flags=re.M), clients
    assert re.search(r"python -m bench\.scale --clients '' --merge$", sizes, flags=re.M), sizes
