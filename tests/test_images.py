"""The container images, statically: the Dockerfiles are read and ``make images`` is run with a
recording stand-in for the engine (the test is about the commands it gets). tests/containers
builds and runs the images for real.

What is checked against what: the services Dockerfile copies only what the repo has and
``.dockerignore`` lets through, and installs every package the chart's commands run; both
Dockerfiles' user is the uid/gid the rendered chart runs pods as; ``make images`` builds exactly
the images the rendered chart, the cache engine's default and the stack files name (function
contexts from the real ``faas-cli build --shrinkwrap``).
"""

from __future__ import annotations

import ast
import fnmatch
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from cache_engine.settings import EngineSettings
from core.services import find_binary
from tests.openfaas.conftest import require_binary, under_ci

ROOT = Path(__file__).resolve().parents[1]
SERVICES_DOCKERFILE = ROOT / "docker" / "fedfaas.Dockerfile"
TEMPLATE_DOCKERFILE = ROOT / "template" / "python3-http" / "Dockerfile"
CHART = ROOT / "charts" / "fedfaas"
STACKS = ("stack.yml", "stack.platform.yml")
#: what the recipe, scripts/images.sh, containers-env.sh and base-images.sh run, besides the
#: engine and faas-cli (no `id`: containers-env.sh then writes no wrapper for the stand-ins)
TOOLS = (
    "bash", "sed", "awk", "dirname", "basename", "env", "cat", "mkdir", "mv", "chmod", "rm",
    "mktemp", "flock", "tee", "tr", "tail", "cut", "head", "timeout", "grep",
)  # fmt: skip


# ------------------------------------------------------------------ helpers
def instructions(dockerfile: Path) -> list[list[str]]:
    """The Dockerfile's instructions as words (continuation lines joined, comments dropped)."""
    lines = [ln for ln in dockerfile.read_text().splitlines() if not ln.lstrip().startswith("#")]
    return [ln.split() for ln in "\n".join(lines).replace("\\\n", " ").splitlines() if ln.strip()]


def copy_sources(dockerfile: Path) -> list[str]:
    """Sources of ``COPY``/``ADD`` from the build context (not ``--from=``)."""
    sources = []
    for words in instructions(dockerfile):
        if words[0].upper() in ("COPY", "ADD") and not any(w.startswith("--from=") for w in words):
            sources += [w for w in words[1:] if not w.startswith("--")][:-1]
    return sources


def dockerignored(path: str) -> bool:
    """Whether /.dockerignore keeps ``path`` (relative to the root) out of the context."""
    patterns = [
        ln.strip()
        for ln in (ROOT / ".dockerignore").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    assert not [p for p in patterns if p.startswith("!")], "exceptions: extend this matcher"
    parts = Path(path).parts
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    return any(
        fnmatch.fnmatch(prefix, pattern) or fnmatch.fnmatch(prefix, pattern.removeprefix("**/"))
        for pattern in patterns
        for prefix in prefixes
    )


def user_ids(dockerfile: Path) -> tuple[int, int, str]:
    """``(uid, gid, USER)`` of the user the Dockerfile creates with useradd."""
    text = " ".join(" ".join(w) for w in instructions(dockerfile))
    uid = re.search(r"useradd [^&;]*--uid (\d+)", text)
    gid = re.search(r"groupadd [^&;]*--gid (\d+)", text)
    user = [w[1] for w in instructions(dockerfile) if w[0].upper() == "USER"]
    assert uid and gid and user, f"{dockerfile}: no useradd --uid, groupadd --gid or USER"
    return int(uid.group(1)), int(gid.group(1)), user[-1]


def render_chart() -> list[dict[str, Any]]:
    helm = find_binary("helm")
    if helm is None:
        reason = "helm not installed: `make helm` builds it"
        if under_ci():
            pytest.fail(f"under CI: {reason}", pytrace=False)
        pytest.skip(reason)
    out = subprocess.run(
        [helm, "template", "rel", str(CHART), "--namespace", "openfaas"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def chart_containers(docs: list[dict[str, Any]]) -> dict[str, tuple[dict[str, Any], Any]]:
    """``"<workload>/<container>"`` -> (container, pod spec), init containers too."""
    found = {}
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
            pod = d["spec"]["template"]["spec"]
            for c in pod.get("initContainers", []) + pod["containers"]:
                found[f"{d['metadata']['name']}/{c['name']}"] = (c, pod)
    return found


def chart_images(docs: list[dict[str, Any]]) -> dict[str, str]:
    return {name: c["image"] for name, (c, _) in chart_containers(docs).items()}


def stack_images(registry: str | None = None, tag: str | None = None) -> dict[str, str]:
    """Function name -> image of both stack files, ``${VAR:-default}`` expanded as faas-cli
    does with FEDFAAS_REGISTRY / FEDFAAS_TAG set to ``registry`` / ``tag`` (or unset)."""
    env = {"FEDFAAS_REGISTRY": registry, "FEDFAAS_TAG": tag}

    def expand(m: re.Match[str]) -> str:
        return env.get(m.group(1)) or m.group(2)

    images = {}
    for stack in STACKS:
        for name, fn in yaml.safe_load((ROOT / stack).read_text())["functions"].items():
            assert name not in images, f"{name} in both stack files"
            images[name] = re.sub(r"\$\{(\w+):-([^}]*)\}", expand, fn["image"])
    return images


def app_version() -> str:
    return str(yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"])


def tools_folder(tmp_path: Path, *fakes: str) -> Path:
    """A PATH folder with the tools the recipe needs and a recording ``fakes`` engine each
    (appends ``<engine>\\t<arg>\\t...`` to ``engine.log`` beside the folder)."""
    folder = tmp_path / "bin"
    folder.mkdir(parents=True)
    for tool in TOOLS:
        found = shutil.which(tool)
        assert found, tool
        (folder / tool).symlink_to(found)
    for fake in fakes:
        script = folder / fake
        script.write_text(
            f"#!/bin/sh\nprintf '%s\\t' {fake} \"$@\" >> '{tmp_path}/engine.log'\n"
            f"echo >> '{tmp_path}/engine.log'\n"
        )
        script.chmod(0o755)
    return folder


def make_images(
    tree: Path, tmp_path: Path, path: Path, *variables: str, openfaas_bin: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``make images VARS`` in ``tree`` with only ``path`` on PATH (the Makefile's venv and
    cache folders pointed at empty ones, so no engine comes from them)."""
    empty = tmp_path / "empty"
    empty.mkdir(exist_ok=True)
    env = {"PATH": str(path), "HOME": str(tmp_path)}
    if openfaas_bin is not None:
        env["FEDFAAS_OPENFAAS_BIN"] = str(openfaas_bin)
    make = shutil.which("make")
    assert make
    return subprocess.run(
        [
            make,
            "--no-print-directory",
            "-C",
            str(tree),
            "images",
            f"VENV={empty}",
            f"CACHE={empty}",
            *variables,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def engine_calls(tmp_path: Path) -> list[list[str]]:
    log = tmp_path / "engine.log"
    return (
        [ln.rstrip("\t").split("\t") for ln in log.read_text().splitlines()] if log.exists() else []
    )


def build_calls(tmp_path: Path) -> dict[str, dict[str, Any]]:
    """The engine's ``build`` calls by image (``-t``): its Dockerfile, context (the last
    argument), network, secrets, build arguments and flags."""
    builds: dict[str, dict[str, Any]] = {}
    for call in engine_calls(tmp_path):
        if call[1] != "build":
            continue
        args, seen = call[2:-1], {"engine": call[0], "context": call[-1], "secrets": []}
        seen["build_args"], seen["flags"] = [], []
        i = 0
        while i < len(args):
            flag = args[i]
            if flag in ("-t", "-f", "--network", "--format"):
                seen[flag.lstrip("-")], i = args[i + 1], i + 2
            elif flag in ("--secret", "--build-arg"):
                seen["secrets" if flag == "--secret" else "build_args"].append(args[i + 1])
                i += 2
            else:
                seen["flags"].append(flag)
                i += 1
        assert seen["t"] not in builds, f"{seen['t']} built twice"
        builds[seen["t"]] = seen
    return builds


def repo_copy(tmp_path: Path) -> Path:
    """The repo without dot folders, tests and build output: faas-cli writes build/ in it."""
    tree = tmp_path / "repo"
    shutil.copytree(
        ROOT,
        tree,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", ".state", ".ci", "*_cache", "__pycache__", "build", "tests", "results"
        ),
    )
    return tree


# ------------------------------------------------------------------ the Dockerfiles
def test_services_dockerfile_copies_what_the_context_has_and_installs_every_chart_module() -> None:
    sources = copy_sources(SERVICES_DOCKERFILE)
    assert sources, "no COPY"
    for source in sources:
        assert (ROOT / source).exists(), f"COPY {source}: not in the repo (the build context)"
        assert not dockerignored(source), f"COPY {source}: .dockerignore leaves it out"
    for kept_out in (".git", ".venv", ".state", "bench/results", "build", "fedfaas/__pycache__"):
        assert dockerignored(kept_out), f".dockerignore lets {kept_out} into the context"

    # pip install . gets pyproject.toml and every package it lists
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {p.rstrip("*") for p in include}
    copied = {Path(s).parts[0] for s in sources}
    assert "pyproject.toml" in copied and packages <= copied, packages - copied
    run = [" ".join(w) for w in instructions(SERVICES_DOCKERFILE) if w[0].upper() == "RUN"]
    assert any("venv --system-site-packages /opt/fedfaas" in r for r in run), run
    assert any("/opt/fedfaas/bin/pip install --no-cache-dir --no-deps . " in r for r in run), run
    assert any("python3-bpfcc" in r for r in run), "bcc's Python bindings"
    env = " ".join(" ".join(w) for w in instructions(SERVICES_DOCKERFILE) if w[0] == "ENV")
    assert "PATH=/opt/fedfaas/bin:$PATH" in env, "`python` must be the venv's"
    assert "COPY --from=build /opt/fedfaas /opt/fedfaas" in SERVICES_DOCKERFILE.read_text()

    # every `python -m X` the chart runs from the services image is a package pip installs
    docs = render_chart()
    services = chart_images(docs)["rel-fedfaas-control-plane/control-plane"]
    modules = {
        c["command"][2]
        for c, _ in chart_containers(docs).values()
        if c["image"] == services and c.get("command", [])[:2] == ["python", "-m"]
    }
    assert {"gateway", "control_plane", "cache_engine", "request_tracker"} <= modules, modules
    for module in modules:
        top = module.split(".")[0]
        assert top in packages, f"the chart runs python -m {module}; pip does not install {top}"
        assert (ROOT / Path(*module.split("."))).with_suffix(".py").is_file() or (
            ROOT / Path(*module.split(".")) / "__main__.py"
        ).is_file(), module


def test_both_dockerfiles_run_as_the_uid_and_gid_of_the_rendered_chart() -> None:
    docs = render_chart()
    images = chart_images(docs)
    ours = {
        images["rel-fedfaas-control-plane/control-plane"],
        images["aggregator/aggregator"],
    }
    uids, gids = set(), set()
    for c, pod in chart_containers(docs).values():
        if c["image"] not in ours:
            continue
        ctx = c.get("securityContext", {})
        gids.add(pod["securityContext"]["fsGroup"])
        if ctx.get("runAsUser", 0) != 0:  # node-folders runs as root to chown the node folders
            uids.add(ctx["runAsUser"])
            gids.add(ctx.get("runAsGroup", pod["securityContext"]["fsGroup"]))
    assert len(uids) == 1 and len(gids) == 1, (uids, gids)
    (uid,), (gid,) = uids, gids

    assert user_ids(SERVICES_DOCKERFILE) == (uid, gid, f"{uid}:{gid}")
    assert user_ids(TEMPLATE_DOCKERFILE) == (uid, gid, "app")
    assert re.search(
        rf"useradd [^\n]*--uid {uid} --gid {gid} [^\n]*app$",
        TEMPLATE_DOCKERFILE.read_text(),
        flags=re.M,
    )


# ------------------------------------------------------------------ make images
def test_make_images_without_an_engine_says_so_in_one_line_and_fails(tmp_path: Path) -> None:
    res = make_images(ROOT, tmp_path, tools_folder(tmp_path))
    assert res.returncode != 0
    said = [ln for ln in res.stderr.splitlines() if ln.startswith("images:")]
    assert len(said) == 1, res.stderr
    assert "none of docker, podman or buildah was found on PATH" in said[0]
    assert f"ghcr.io/fedfaas/fedfaas:{app_version()}" in said[0]
    assert "stack.yml stack.platform.yml" in said[0]
    assert not (tmp_path / "engine.log").exists()

    res = make_images(ROOT, tmp_path, tools_folder(tmp_path / "b"), "ENGINE=nerdctl")
    assert res.returncode != 0 and "images: ENGINE=nerdctl is not on PATH" in res.stderr


def test_a_docker_client_that_reaches_no_daemon_is_passed_over_for_podman(tmp_path: Path) -> None:
    """A machine image may ship the docker client alone (these machines do): ``docker build``
    would fail at once, so podman builds."""
    faas_cli = require_binary("faas-cli")
    tree = repo_copy(tmp_path)
    folder = tools_folder(tmp_path, "podman", "docker")
    with (folder / "docker").open("a") as docker:  # the recording stand-in, then no daemon
        docker.write('echo "Cannot connect to the Docker daemon" >&2; exit 1\n')
    res = make_images(tree, tmp_path, folder, "IMAGES=echo", openfaas_bin=faas_cli.parent)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "docker is on PATH but reaches no Docker daemon" in res.stderr
    calls = engine_calls(tmp_path)
    assert [c[:2] for c in calls if c[0] == "docker"] == [["docker", "info"]]
    assert set(build_calls(tmp_path)) == {stack_images("ghcr.io/fedfaas", app_version())["echo"]}


def test_make_images_builds_exactly_the_images_the_chart_engine_and_stacks_name(
    tmp_path: Path,
) -> None:
    faas_cli = require_binary("faas-cli")
    docs = render_chart()
    tree = repo_copy(tmp_path)
    res = make_images(
        tree, tmp_path, tools_folder(tmp_path, "docker", "podman"), openfaas_bin=faas_cli.parent
    )
    assert res.returncode == 0, res.stdout + res.stderr
    calls = engine_calls(tmp_path)
    assert {c[0] for c in calls} == {"docker"}, "docker comes first"
    assert calls[0][1] == "info", "a docker that reaches a daemon"
    calls = calls[1:]
    built = build_calls(tmp_path)
    # then only for the size of each image built (the table at the end)
    rest = calls[len(built) :]
    assert [c[1] for c in calls[: len(built)]] == ["build"] * len(built)
    assert sorted(c[-1] for c in rest) == sorted(built)
    assert all(c[1:5] == ["image", "inspect", "--format", "{{.Size}}"] for c in rest), rest
    system_ca = "/etc/ssl/certs/ca-certificates.crt"
    for call in built.values():
        # downloads on the host's network (never an engine's bridge), the CA bundle as a
        # secret (none when the host has no bundle), docker's own image format
        assert call["network"] == "host" and "format" not in call, call
        assert call["secrets"] == ([f"id=ca,src={system_ca}"] if Path(system_ca).is_file() else [])
        assert call["flags"] == [], call

    # the services image: the chart's, from docker/ with the repo as context
    images = chart_images(docs)
    services = images["rel-fedfaas-node-gateway/node-gateway"]
    for part in ("control-plane", "cache-engine", "request-tracker"):
        assert images[f"rel-fedfaas-{part}/{part}"] == services
    assert (built[services]["f"], built[services]["context"]) == ("docker/fedfaas.Dockerfile", ".")
    assert built[services]["build_args"] == []
    # the functions: as the stack files name them, from faas-cli's contexts, on Python 3.11
    functions = stack_images()
    assert set(built) == {services, *functions.values()}
    assert functions["aggregator"] == images["aggregator/aggregator"]
    engine = next(c for c, _ in chart_containers(docs).values() if c["name"] == "cache-engine")
    chart_flstore = {e["name"]: e.get("value") for e in engine["env"]}[
        "FEDFAAS_ENGINE_FUNCTION_IMAGE"
    ]
    assert functions["flstore"] == chart_flstore
    assert functions["flstore"] == EngineSettings.model_fields["function_image"].default
    template = TEMPLATE_DOCKERFILE.read_text()
    for fn, image in functions.items():
        assert (built[image]["f"], built[image]["context"]) == (
            f"build/{fn}/Dockerfile",
            f"build/{fn}",
        )
        assert built[image]["build_args"] == ["PYTHON_VERSION=3.11"]
        assert (tree / "build" / fn / "Dockerfile").read_text() == template
        assert (tree / "build" / fn / "function" / "handler.py").is_file()
        # one template for both stack files: each context holds everything it copies
        for source in copy_sources(TEMPLATE_DOCKERFILE):
            assert (tree / "build" / fn / source).exists(), f"{fn}: no {source} in its context"

    # ENGINE, REGISTRY, TAG, IMAGES, CA_BUNDLE and NO_CACHE are passed on: to the services
    # image and to faas-cli's names; podman gets the base images first and docker's format
    (tmp_path / "engine.log").unlink()
    res = make_images(
        tree,
        tmp_path,
        tmp_path / "bin",
        "ENGINE=podman",
        "REGISTRY=reg.example:5000/ff",
        "TAG=9.9.9",
        "CA_BUNDLE=",
        openfaas_bin=faas_cli.parent,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    calls = engine_calls(tmp_path)
    assert {c[0] for c in calls} == {"podman"}
    built = build_calls(tmp_path)
    assert set(built) == {
        "reg.example:5000/ff/fedfaas:9.9.9",
        *stack_images("reg.example:5000/ff", "9.9.9").values(),
    }
    assert all(b["secrets"] == [] and b["format"] == "docker" for b in built.values())
    # scripts/base-images.sh asked for the bases before the first build (the stand-in has them)
    first_build = next(i for i, c in enumerate(calls) if c[1] == "build")
    asked = {c[3] for c in calls[:first_build] if c[1:3] == ["image", "exists"]}
    assert {
        "docker.io/library/debian:bookworm-slim",
        "ghcr.io/openfaas/of-watchdog:0.11.3",
    } <= asked

    (tmp_path / "engine.log").unlink()
    res = make_images(
        tree,
        tmp_path,
        tmp_path / "bin",
        "ENGINE=podman",
        "IMAGES=fedfaas echo",
        f"CA_BUNDLE={TEMPLATE_DOCKERFILE}",
        "NO_CACHE=1",
        openfaas_bin=faas_cli.parent,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    built = build_calls(tmp_path)
    assert set(built) == {f"ghcr.io/fedfaas/fedfaas:{app_version()}", stack_images()["echo"]}
    assert all(b["secrets"] == [f"id=ca,src={TEMPLATE_DOCKERFILE}"] for b in built.values())
    assert all(b["flags"] == ["--no-cache"] for b in built.values())

    res = make_images(
        tree, tmp_path, tmp_path / "bin", "ENGINE=podman", "CA_BUNDLE=/nonexistent/ca.crt"
    )
    assert res.returncode != 0
    assert "images: CA_BUNDLE=/nonexistent/ca.crt is not a file" in res.stderr


def test_the_default_tag_is_the_chart_app_version_for_every_image() -> None:
    tag = app_version()
    assert re.fullmatch(r"\d+\.\d+\.\d+", tag)
    assert EngineSettings.model_fields["function_image"].default.endswith(f":{tag}")
    assert all(image.endswith(f":{tag}") for image in stack_images().values())


def test_the_services_start_without_importing_torch() -> None:
    """docker/fedfaas.Dockerfile leaves torch out (pyproject.toml's `torch` extra) on this
    ground: no module the chart runs from the services image imports torch when it starts."""
    modules = [
        "gateway",
        "control_plane",
        "cache_engine",
        "request_tracker",
        "fedfaas.provision_minio",
    ]
    entry = []
    for module in modules:
        path = ROOT / Path(*module.split("."))
        main = path / "__main__.py" if path.is_dir() else path.with_suffix(".py")
        entry.append(module + (".__main__" if path.is_dir() else ""))
        # and what main() imports inside itself (control_plane: its app)
        for node in ast.walk(ast.parse(main.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                entry.append(node.module)
    code = (
        "import importlib, sys\n"
        f"for m in {entry!r}: importlib.import_module(m)\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'torchvision'}))"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]", res.stdout


def test_the_services_image_installs_no_torch_and_no_unreachable_index() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    core = {
        re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0] for d in pyproject["project"]["dependencies"]
    }
    assert not core & {"torch", "torchvision"}, "torch is the `torch` extra's"
    extra = pyproject["project"]["optional-dependencies"]["torch"]
    assert {re.split(r"[<>=]", d, maxsplit=1)[0] for d in extra} == {"torch", "torchvision"}
    text = SERVICES_DOCKERFILE.read_text()
    code = "\n".join(" ".join(w) for w in instructions(SERVICES_DOCKERFILE))
    assert "index-url" not in code and "download.pytorch.org" not in code
    # the dependencies come from pyproject.toml's core list, not `pip install .[torch]`
    assert '["project"]["dependencies"]' in text and "[torch]" not in code
    # make setup keeps the dev venv as it was
    assert '-e ".[dev,bench,torch]"' in (ROOT / "scripts" / "setup.sh").read_text()


def test_no_function_image_installs_torch() -> None:
    """docs/openfaas-kubernetes.md: no image installs PyTorch (its PyPI wheels bring CUDA's
    libraries, gigabytes): the demo's digits-evaluator scores with numpy. The template's and every stack function's
    requirements leave torch out (tests/openfaas/test_function_requirements.py checks that
    they cover what each handler imports; the handler's tests run in the build, without it)."""
    files = [TEMPLATE_DOCKERFILE.parent / "requirements.txt"]
    for stack in STACKS:
        for fn in yaml.safe_load((ROOT / stack).read_text())["functions"].values():
            files.append(ROOT / fn["handler"] / "requirements.txt")
    assert len(files) == 1 + len(stack_images())
    for path in files:
        lines = [ln.split("#", 1)[0].strip() for ln in path.read_text().splitlines()]
        names = {re.split(r"[<>=!~\[; ]", ln, maxsplit=1)[0].lower() for ln in lines if ln}
        assert not names & {"torch", "torchvision"}, path


@pytest.mark.parametrize(
    "dockerfile", [SERVICES_DOCKERFILE, TEMPLATE_DOCKERFILE], ids=lambda p: p.parent.name
)
def test_every_pip_step_reads_the_ca_bundle_from_a_secret_mount_only(dockerfile: Path) -> None:
    """A build secret is mounted for its step and is in no layer (tests/containers checks the
    layers of a real build); a build argument, ENV or COPY of the bundle would be in one."""
    steps = instructions(dockerfile)
    pip = [w for w in steps if w[0] == "RUN" and any("pip" in x for x in w) and "install" in w]
    assert pip, "no pip step"
    for words in pip:
        step = " ".join(words)
        assert words[1] == "--mount=type=secret,id=ca,mode=0444", step
        assert "if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi" in step
    for words in steps:
        if words[0] in ("ARG", "ENV", "COPY", "ADD"):
            assert not any("ca-certificates" in w or "CERT" in w or "/secrets/" in w for w in words)


def test_the_aggregator_image_has_no_torch_and_its_torch_kernel_says_so() -> None:
    requirements = (ROOT / "functions" / "aggregator" / "requirements.txt").read_text()
    lines = [ln.split("#")[0].strip() for ln in requirements.splitlines()]
    assert not [ln for ln in lines if ln.startswith("torch")]
    platform = yaml.safe_load((ROOT / "stack.platform.yml").read_text())
    assert (
        platform["functions"]["aggregator"]["environment"]["FEDFAAS_AGGREGATOR_KERNEL"] == "numpy"
    )
    # without torch (as in the image), the torch kernel refuses to start, saying why
    code = (
        "import sys\n"
        "sys.modules['torch'] = None\n"
        "sys.path.insert(0, 'functions')\n"
        "from aggregator.settings import AggregatorSettings\n"
        "assert AggregatorSettings(kernel='numpy').kernel == 'numpy'\n"
        "AggregatorSettings(kernel='torch')\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert res.returncode == 1
    assert "FEDFAAS_AGGREGATOR_KERNEL=torch, but this image has no torch" in res.stderr
    assert "functions/aggregator/requirements.txt" in res.stderr
