"""Worker Deployment Versioning: Temporal's own answer to shipping new agent code while runs are
open (see docs/deploy.md).

A versioned worker belongs to a *deployment* (a name) and a *build* (an id). relaykit makes
``AgentRun`` **pinned** by default: a run is served by the workers of the build that started it
until it ends, while new runs go to the deployment's *current* build. A worker never makes its
build current by itself; :func:`set_current_build` (``relaykit deployment set-current``) does,
through Temporal's API, so an operator decides when new runs move. ``upgrade_on_continue_as_new``
moves long runs to the current build at their next continue-as-new instead.

Client side only: nothing here runs in workflow code.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field

from temporalio.client import Client, WorkflowExecution
from temporalio.common import VersioningBehavior, WorkerDeploymentVersion
from temporalio.worker import WorkerDeploymentConfig

from relaykit.errors import ConfigurationError

DEPLOYMENT_ENV = "RELAYKIT_DEPLOYMENT"
BUILD_ID_ENV = "RELAYKIT_BUILD_ID"
VERSION_SEARCH_ATTRIBUTE = "TemporalWorkerDeploymentVersion"


def deployment_config(
    deployment: str | None = None, build_id: str | None = None
) -> WorkerDeploymentConfig | None:
    """The Temporal worker option for ``deployment``/``build_id`` (default: the environment),
    or ``None`` for an unversioned worker. Both or neither must be given."""
    deployment = deployment if deployment is not None else os.environ.get(DEPLOYMENT_ENV) or None
    build_id = build_id if build_id is not None else os.environ.get(BUILD_ID_ENV) or None
    if deployment is None and build_id is None:
        return None
    if deployment is None or build_id is None:
        missing = "deployment" if deployment is None else "build id"
        raise ConfigurationError(
            f"a versioned worker needs both a deployment and a build id; the {missing} is missing",
            hint=f"pass --deployment and --build-id (or set {DEPLOYMENT_ENV} and {BUILD_ID_ENV})",
        )
    check_names(deployment, build_id)
    return WorkerDeploymentConfig(
        version=WorkerDeploymentVersion(deployment_name=deployment, build_id=build_id),
        use_worker_versioning=True,
        default_versioning_behavior=VersioningBehavior.PINNED,
    )


def check_names(deployment: str, build_id: str | None = None) -> None:
    # Temporal writes a version as "<deployment>.<build id>": a dot in the name is ambiguous.
    if not deployment.strip():
        raise ConfigurationError("the deployment name is empty")
    if "." in deployment:
        raise ConfigurationError(
            f"deployment name {deployment!r} contains a '.'",
            hint="Temporal joins deployment and build as NAME.BUILD_ID; use '-' or '_' instead",
        )
    if build_id is not None and not build_id.strip():
        raise ConfigurationError("the build id is empty")


async def set_current_build(client: Client, deployment: str, build_id: str) -> None:
    """Make ``build_id`` the build new runs of ``deployment`` start on (what ``temporal worker
    deployment set-current-version`` does). Runs already pinned elsewhere stay where they are."""
    from temporalio.api.workflowservice.v1 import SetWorkerDeploymentCurrentVersionRequest

    check_names(deployment, build_id)
    await client.workflow_service.set_worker_deployment_current_version(
        SetWorkerDeploymentCurrentVersionRequest(
            namespace=client.namespace,
            deployment_name=deployment,
            build_id=build_id,
            identity=client.identity,
        )
    )


@dataclass
class BuildStatus:
    build_id: str
    status: str
    """Temporal's word for the build: current, ramping, draining, drained or inactive."""
    open_runs: int = 0


@dataclass
class DeploymentStatus:
    name: str
    current_build: str | None
    builds: list[BuildStatus] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return {
            "deployment": self.name,
            "current_build": self.current_build,
            "builds": [vars(build) for build in self.builds],
        }


async def deployment_status(
    client: Client, deployment: str, *, limit: int = 10_000
) -> DeploymentStatus:
    """The builds of ``deployment``, which is current, and how many ``AgentRun`` executions are
    open on each, so an operator knows when an old build's workers may stop."""
    from temporalio.api.enums.v1 import WorkerDeploymentVersionStatus
    from temporalio.api.workflowservice.v1 import DescribeWorkerDeploymentRequest

    from relaykit.workflows.loop import AGENT_RUN_WORKFLOW

    check_names(deployment)
    described = await client.workflow_service.describe_worker_deployment(
        DescribeWorkerDeploymentRequest(namespace=client.namespace, deployment_name=deployment)
    )
    info = described.worker_deployment_info
    current = info.routing_config.current_deployment_version.build_id or None
    open_runs: Counter[str] = Counter()
    query = f"WorkflowType = '{AGENT_RUN_WORKFLOW}' AND ExecutionStatus = 'Running'"
    async for execution in client.list_workflows(query, limit=limit):
        build = run_build(execution)
        if build is not None and build[0] == deployment:
            open_runs[build[1]] += 1
    builds = []
    for summary in info.version_summaries:
        build_id = summary.deployment_version.build_id
        word = WorkerDeploymentVersionStatus.Name(summary.status)
        word = word.removeprefix("WORKER_DEPLOYMENT_VERSION_STATUS_").lower()
        builds.append(BuildStatus(build_id, word, open_runs.pop(build_id, 0)))
    return DeploymentStatus(deployment, current, builds)


def run_build(execution: WorkflowExecution) -> tuple[str, str] | None:
    """(deployment, build id) of the build serving a listed or described execution, or
    ``None`` when unversioned workers serve it. Visibility records carry it as Temporal's
    ``TemporalWorkerDeploymentVersion`` search attribute (``"<deployment>:<build id>"``),
    descriptions in their versioning info."""
    version = getattr(
        getattr(execution.raw_info, "versioning_info", None), "deployment_version", None
    )
    if version is not None and version.build_id:
        return version.deployment_name, version.build_id
    values = execution.search_attributes.get(VERSION_SEARCH_ATTRIBUTE) or []
    value = values[0] if values else None
    if isinstance(value, str) and ":" in value:
        deployment, build_id = value.split(":", 1)
        return deployment, build_id
    return None
