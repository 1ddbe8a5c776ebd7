"""The ``failure`` section: fault tolerance, and the timeout of every wait on a remote thing."""

from __future__ import annotations

from pydantic import Field

from raylight.config.base import ConfigModel

# How long an address has to answer (FailureConfig.connect_timeout_s, raylight submit's and
# raylight jobs' --connect-timeout).
CONNECT_TIMEOUT_S = 15.0


class FailureConfig(ConfigModel):
    """Fault tolerance, and the timeout of every wait on a remote thing."""

    max_failures: int = Field(
        0,
        ge=-1,
        description="Restarts allowed after worker failures; -1 for unlimited.",
    )
    hang_timeout_s: float = Field(
        300.0,
        gt=0,
        description="A worker that reports no progress (no batch, report or collective) "
        "for this long, counted from when its loop starts, is declared hung. Gathering, "
        "writing or reading a checkpoint counts as progress while it lasts (its collectives "
        "still time out after collective_timeout_s).",
    )
    health_check_timeout_s: float = Field(
        30.0, gt=0, description="A worker that does not answer a health poll in this long is hung."
    )
    poll_interval_s: float = Field(
        0.2, gt=0, description="How often the driver polls workers for status."
    )
    connect_timeout_s: float = Field(
        CONNECT_TIMEOUT_S, gt=0, description="How long to try reaching a Ray cluster given by address."
    )
    placement_timeout_s: float = Field(
        120.0,
        gt=0,
        description="How long to wait for the cluster to place all workers before failing.",
    )
    worker_start_timeout_s: float = Field(
        120.0,
        gt=0,
        description="How long workers may take to start, and to join their process group "
        "before the loop starts.",
    )
    collective_timeout_s: float = Field(
        1800.0,
        gt=0,
        description="torch.distributed timeout for one collective; the driver's hang "
        "detection usually acts first.",
    )
    restart_backoff_s: float = Field(
        1.0,
        ge=0,
        description="Wait before a restart that follows another failure with no new "
        "checkpoint between them; it doubles with each such failure in a row, up to "
        "restart_backoff_max_s. The first restart after progress is immediate.",
    )
    restart_backoff_max_s: float = Field(
        60.0, ge=0, description="The longest wait between restarts (see restart_backoff_s)."
    )
    max_preemptions: int = Field(
        -1,
        ge=-1,
        description="Restarts allowed after nodes were taken away with notice (Ray's node "
        "drain, a SIGTERM, a cloud's preemption notice); they do not count against "
        "max_failures. -1 for unlimited.",
    )
    rendezvous_retries: int = Field(
        1,
        ge=0,
        description="Times a run forms its process group again when a worker fails to join "
        "it (before the loop begins: a peer's connection closed or refused, a port taken in a "
        "race); they do not count against max_failures. A worker that dies is a failure.",
    )
    preemption_notices: list[str] = Field(
        default_factory=list,
        description="Preemption notices the workers watch for, besides Ray's node drain and "
        "SIGTERM: 'aws' (spot instance-action), 'gcp' (preempted, host maintenance), 'azure' "
        "(scheduled events), or 'file:PATH' (a file a preStop hook or spot agent writes). "
        "Each worker polls its node's metadata endpoint every few seconds.",
    )
    preemption_grace_s: float = Field(
        30.0,
        gt=0,
        description="A worker process that gets SIGTERM treats it as its node's preemption "
        "notice and exits this long after it (Kubernetes' default grace period), unless the "
        "driver lets it go first.",
    )
