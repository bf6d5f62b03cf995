"""``docker-compose.yml`` cannot be started here (no Docker engine), so these tests hold it to the
properties that break silently: pinned images, start-up ordering, published ports, and the
search attributes staying in step with :mod:`relaykit.search_attributes`."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml
from moto.server import ThreadedMotoServer

from relaykit import search_attributes

COMPOSE_FILE = Path(__file__).resolve().parent.parent / "docker-compose.yml"
VERSION_TAG = re.compile(r"^v?\d+\.\d+")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(loaded, dict)
    return loaded


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = compose["services"]
    return found


def environment(service: dict[str, Any]) -> dict[str, str]:
    """Compose accepts a mapping or a list of ``KEY=VALUE``; tests read both the same way."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        return dict(item.split("=", 1) for item in env)
    return {key: str(value) for key, value in env.items()}


def image_tag(image: str) -> str:
    name = image.split("@", 1)[0].rsplit("/", 1)[-1]
    return name.split(":", 1)[1] if ":" in name else ""


def published_ports(service: dict[str, Any]) -> set[int]:
    ports: set[int] = set()
    for entry in service.get("ports", []):
        if isinstance(entry, dict):
            ports.add(int(entry["published"]))
        else:
            parts = str(entry).split(":")
            ports.add(int(parts[-2] if len(parts) > 1 else parts[-1]))
    return ports


def test_services_exist(services: dict[str, Any]) -> None:
    expected = {"postgresql", "temporal-schema", "temporal", "temporal-setup", "temporal-ui"}
    assert expected | {"worker"} <= set(services)


def test_every_image_is_pinned_to_a_version(services: dict[str, Any]) -> None:
    images = {name: svc["image"] for name, svc in services.items() if "image" in svc}
    for name, svc in services.items():
        inline = (svc.get("build") or {}).get("dockerfile_inline", "")
        for base in re.findall(r"^FROM\s+(\S+)", inline, flags=re.MULTILINE):
            images[f"{name} (FROM)"] = base
    assert images
    for where, image in images.items():
        tag = image_tag(image)
        assert tag and tag != "latest", f"{where}: {image} is not pinned"
        assert VERSION_TAG.match(tag) or MINIO_RELEASE_TAG.match(tag), (
            f"{where}: {image} is pinned to no version"
        )


def test_server_and_admin_tools_versions_match(services: dict[str, Any]) -> None:
    server = image_tag(services["temporal"]["image"])
    for name in ("temporal-schema", "temporal-setup"):
        assert services[name]["image"].startswith("temporalio/admin-tools:")
        assert image_tag(services[name]["image"]) == server, name


def test_ports(services: dict[str, Any]) -> None:
    assert 7233 in published_ports(services["temporal"])
    assert 8080 in published_ports(services["temporal-ui"])


def test_healthchecks(services: dict[str, Any]) -> None:
    postgres_check = services["postgresql"]["healthcheck"]["test"]
    assert "pg_isready" in " ".join(postgres_check)
    assert services["temporal"]["healthcheck"]["test"]


def test_startup_order(services: dict[str, Any]) -> None:
    def condition(service: str, dependency: str) -> str:
        return str(services[service]["depends_on"][dependency]["condition"])

    assert condition("temporal", "postgresql") == "service_healthy"
    assert condition("temporal-schema", "postgresql") == "service_healthy"
    assert condition("temporal", "temporal-schema") == "service_completed_successfully"
    assert condition("temporal-setup", "temporal") == "service_healthy"
    assert condition("temporal-ui", "temporal-setup") == "service_completed_successfully"
    assert condition("worker", "temporal-setup") == "service_completed_successfully"


def test_temporal_uses_postgres(services: dict[str, Any]) -> None:
    env = environment(services["temporal"])
    assert env["DB"] == "postgres12"
    assert env["POSTGRES_SEEDS"] == "postgresql"


def test_registers_exactly_relaykits_search_attributes(services: dict[str, Any]) -> None:
    setup = services["temporal-setup"]
    registered = environment(setup)["RELAYKIT_SEARCH_ATTRIBUTES"].split()
    assert sorted(registered) == sorted(search_attributes.specs())
    assert len(registered) == len(set(registered))
    # The list must be what the script registers, not a decoration next to it.
    script = "\n".join(setup["command"])
    assert "for spec in $$RELAYKIT_SEARCH_ATTRIBUTES" in script
    assert "search-attribute create" in script


def test_dynamic_config_lifts_the_transfer_poll_cap(
    compose: dict[str, Any], services: dict[str, Any]
) -> None:
    mounted = {c["source"]: c["target"] for c in services["temporal"]["configs"]}
    path = environment(services["temporal"])["DYNAMIC_CONFIG_FILE_PATH"]
    source = next(name for name, target in mounted.items() if target == path)
    values = yaml.safe_load(compose["configs"][source]["content"])
    assert values["history.transferProcessorMaxPollRPS"][0]["value"] >= 10000


def test_ui_and_worker_point_at_temporal(services: dict[str, Any]) -> None:
    assert environment(services["temporal-ui"])["TEMPORAL_ADDRESS"] == "temporal:7233"
    worker = services["worker"]
    assert environment(worker)["TEMPORAL_ADDRESS"] == "temporal:7233"
    assert worker.get("profiles"), "the worker must not start without --profile"


MINIO_RELEASE_TAG = re.compile(r"^RELEASE\.\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}Z$")


def test_minio_images_are_pinned_to_a_release(services: dict[str, Any]) -> None:
    for name in ("minio", "minio-setup"):
        assert MINIO_RELEASE_TAG.match(image_tag(services[name]["image"])), name


def test_minio_serves_s3_on_loopback_with_a_private_bucket(services: dict[str, Any]) -> None:
    minio = services["minio"]
    assert "127.0.0.1:9000:9000" in minio["ports"]
    assert all(str(p).startswith("127.0.0.1:") for p in minio["ports"])
    assert minio["healthcheck"]["test"]
    setup = services["minio-setup"]
    assert setup["depends_on"]["minio"]["condition"] == "service_healthy"
    script = "\n".join(setup["command"])
    assert "mc mb --ignore-existing" in script
    assert "mc anonymous set none" in script
    assert "mc ilm rule add" in script
    assert int(environment(setup)["RELAYKIT_EXPIRE_DAYS"]) > 30  # above the namespace retention


def test_worker_stores_in_minio(services: dict[str, Any]) -> None:
    worker = services["worker"]
    env = environment(worker)
    assert env["RELAYKIT_STORE"].startswith("s3://")
    bucket = env["RELAYKIT_STORE"].removeprefix("s3://").split("/", 1)[0]
    assert bucket == environment(services["minio-setup"])["RELAYKIT_BUCKET"]
    assert env["AWS_ENDPOINT_URL"] == "http://minio:9000"
    assert env["AWS_ALLOW_HTTP"] == "true"
    assert env["AWS_ACCESS_KEY_ID"] == environment(services["minio"])["MINIO_ROOT_USER"]
    assert env["AWS_SECRET_ACCESS_KEY"] == environment(services["minio"])["MINIO_ROOT_PASSWORD"]
    assert worker["depends_on"]["minio-setup"]["condition"] == "service_completed_successfully"
    assert set(services["minio"]["profiles"]) >= set(worker["profiles"])


# --- the worker service, run without Docker ---------------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


_INTERPOLATION = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}")


def interpolate(value: str, shell: dict[str, str]) -> str:
    """Compose's ``${VAR:-default}`` substitution from the shell's environment."""
    return _INTERPOLATION.sub(lambda m: shell.get(m.group(1)) or (m.group(2) or ""), value)


def test_the_compose_worker_service_serves_a_run_with_the_scripted_model(
    services: dict[str, Any], temporal_server: Any, tmp_path: Path
) -> None:
    # The worker service's exact command (the image's CMD) and environment, as compose would
    # pass them from a shell that only sets RELAYKIT_MODEL=scripted; the address points at the
    # test server instead of the compose network's `temporal:7233`.
    import json
    import os
    import subprocess
    import sys

    service = services["worker"]
    dockerfile = service["build"]["dockerfile_inline"]
    command = json.loads(re.search(r"^CMD\s+(\[.*\])\s*$", dockerfile, re.MULTILINE).group(1))
    image_env = dict(re.findall(r"^ENV\s+(\w+)=(\S+)", dockerfile, re.MULTILINE))
    assert command[0] == "relaykit"
    command[0] = str(Path(sys.executable).with_name("relaykit"))
    shell = {"RELAYKIT_MODEL": "scripted"}
    env = {key: interpolate(value, shell) for key, value in environment(service).items()}
    assert env["TEMPORAL_ADDRESS"] == "temporal:7233"
    env["TEMPORAL_ADDRESS"] = temporal_server.address
    repo = str(COMPOSE_FILE.parent)
    env["PYTHONPATH"] = image_env["PYTHONPATH"].replace("/app", repo)
    # The store's S3 endpoint likewise: moto's S3 server stands in for the MinIO service, with
    # the bucket minio-setup creates and the credentials the service passes.
    assert env["AWS_ENDPOINT_URL"] == "http://minio:9000"
    s3_server = ThreadedMotoServer(ip_address="127.0.0.1", port=_free_port(), verbose=False)
    s3_server.start()
    endpoint = f"http://127.0.0.1:{s3_server._port}"
    env["AWS_ENDPOINT_URL"] = endpoint
    s3 = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=env["AWS_REGION"],
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
    )
    bucket = env["RELAYKIT_STORE"].removeprefix("s3://").split("/", 1)[0]
    s3.create_bucket(Bucket=bucket)
    base = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR")}
    worker = subprocess.Popen(
        command,
        cwd=tmp_path,
        env={**base, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "relaykit.cli",
                "run",
                "triage",
                "I was charged twice",
                "--wait",
            ],
            cwd=repo,
            env={**os.environ, "TEMPORAL_ADDRESS": temporal_server.address, "NO_COLOR": "1"},
            capture_output=True,
            text=True,
            timeout=90,
        )
        stored = s3.list_objects_v2(Bucket=bucket).get("KeyCount", 0)
    finally:
        worker.terminate()
        _, worker_log = worker.communicate(timeout=20)
        s3_server.stop()
    assert done.returncode == 0, done.stderr + worker_log
    assert stored > 0  # the run's transcript went to the bucket, not to the worker's disk
    assert not any(tmp_path.rglob("*")), "the worker wrote to its own disk"
    assert "You were charged twice" in done.stdout
    assert "agent billing" in done.stderr
    assert "scripted stand-in model (RELAYKIT_MODEL=scripted" in worker_log
    assert "openai:scripted" not in worker_log


def test_the_compose_worker_passes_the_model_settings_on(services: dict[str, Any]) -> None:
    env = environment(services["worker"])
    for name in (
        "RELAYKIT_MODEL",
        "OPENAI_API_KEY",
        "OPENAI_BASE_URL",
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_BASE_URL",
    ):
        assert env.get(name) == f"${{{name}:-}}", name


# --- building the image and reaching the services from the host ------------------------------

REPO = COMPOSE_FILE.parent


def test_the_build_context_leaves_the_virtualenv_git_caches_and_local_data_out() -> None:
    # Without it `docker compose build` sends the whole .venv (hundreds of MB) to the daemon.
    patterns = {
        line.strip().rstrip("/")
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".venv", ".git", ".relaykit", "**/__pycache__", ".pytest_cache"} <= patterns


def test_the_worker_image_installs_the_codec_and_mcp_extras(services: dict[str, Any]) -> None:
    dockerfile = services["worker"]["build"]["dockerfile_inline"]
    installs = re.findall(r"^RUN pip install .*?(\S*/app\S*)\s*$", dockerfile, re.MULTILINE)
    assert len(installs) == 1, dockerfile
    extras = re.search(r"\[([^\]]*)\]", installs[0])
    assert extras is not None, installs[0]
    assert {"codec", "mcp"} <= {e.strip() for e in extras.group(1).split(",")}


def test_the_readme_says_how_a_host_cli_reaches_the_compose_store_and_temporal(
    services: dict[str, Any],
) -> None:
    # The README's exports, checked against what the worker service uses, with the compose
    # network's host names replaced by the ports compose publishes on the host.
    readme = (REPO / "README.md").read_text()
    exported = dict(
        re.findall(
            r"(?:^export |(?<= ))(\w+)=(\S+)",
            "\n".join(line for line in readme.splitlines() if line.startswith("export ")),
            re.MULTILINE,
        )
    )
    worker = {k: interpolate(v, {}) for k, v in environment(services["worker"]).items()}
    assert exported["TEMPORAL_ADDRESS"] == "127.0.0.1:7233"
    assert 7233 in published_ports(services["temporal"])
    assert exported["RELAYKIT_UI_URL"] == "http://127.0.0.1:8080"
    assert 8080 in published_ports(services["temporal-ui"])
    assert exported["RELAYKIT_STORE"] == worker["RELAYKIT_STORE"]
    assert worker["AWS_ENDPOINT_URL"] == "http://minio:9000"
    assert exported["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9000"
    assert "127.0.0.1:9000:9000" in services["minio"]["ports"]
    for name in ("AWS_ALLOW_HTTP", "AWS_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert exported[name] == worker[name], name
