"""The JSON shapes this SDK reads and sends, as typed dictionaries.

They mirror the server's schemas (`GET /openapi.json`: `Lease`, `JobView`, `StepView`,
`LeaseOutcome`, ...); `tests/test_wire.py` checks their field names against a real server's
document, so the SDK cannot drift from it. Keys a server may leave out are in the `total=False`
part of each type."""

from __future__ import annotations

from typing import Any, Dict, List, Literal, Optional, TypedDict

Json = Any

# ---- what an agent receives and sends ----


class _LeaseRequired(TypedDict):
    lease_id: str
    kind: Literal["work", "compensate"]
    job_id: str
    step: str
    agent: str
    attempt: int
    payload: Json
    inputs: Dict[str, Json]
    idempotency_key: str
    complete_by: str
    lease_ms: int
    timeout_ms: int


class Lease(_LeaseRequired, total=False):
    """One leased attempt (`POST /v1/agents/{agent}/leases` answers a list of them)."""

    undo_attempt: int


class _LeaseRequestRequired(TypedDict):
    worker: str


class LeaseRequest(_LeaseRequestRequired, total=False):
    """`POST /v1/agents/{agent}/leases` body."""

    max: int
    wait: str


class HeartbeatRequest(TypedDict, total=False):
    """`POST /v1/leases/{id}/heartbeat` body."""

    progress: Json


class HeartbeatResponse(TypedDict):
    complete_by: str
    lease_ms: int
    cancel: bool


class CompleteRequest(TypedDict, total=False):
    """`POST /v1/leases/{id}/complete` body."""

    result: Json


class _FailRequestRequired(TypedDict):
    error: str


class FailRequest(_FailRequestRequired, total=False):
    """`POST /v1/leases/{id}/fail` body."""

    retryable: bool


class _CompleteReportRequired(TypedDict):
    outcome: Literal["complete"]
    lease_id: str


class CompleteReport(_CompleteReportRequired, total=False):
    """A completion in a `POST /v1/leases:report` batch."""

    result: Json


class _FailReportRequired(TypedDict):
    outcome: Literal["fail"]
    lease_id: str
    error: str


class FailReport(_FailReportRequired, total=False):
    """A failure in a `POST /v1/leases:report` batch."""

    retryable: bool


class _ProblemRequired(TypedDict):
    type: str
    title: str
    status: int
    detail: str


class Problem(_ProblemRequired, total=False):
    """An `application/problem+json` error body."""

    code: str
    field: str


class _ReportResultRequired(TypedDict):
    lease_id: str
    status: int


class ReportResult(_ReportResultRequired, total=False):
    """One report's answer in a `POST /v1/leases:report` batch."""

    job_id: str
    job_state: str
    problem: Problem


# ---- jobs ----

class _HttpTargetRequired(TypedDict):
    url: str


# `async` is a Python keyword: this part is written in the functional form.
_HttpTargetOptional = TypedDict(
    "_HttpTargetOptional",
    {"method": str, "headers": Dict[str, str], "timeout": str, "async": bool},
    total=False,
)


class HttpTarget(_HttpTargetRequired, _HttpTargetOptional):
    """An HTTP endpoint the server calls itself instead of an agent pool."""


class WaitingReason(TypedDict):
    code: str
    text: str


class Backoff(TypedDict, total=False):
    initial: str
    factor: float
    max: str


class CompensateSpec(TypedDict, total=False):
    """How to undo a step: `agent` or `http`, with an optional payload and limits."""

    agent: str
    http: HttpTarget
    payload: Json
    timeout: str
    deadline: str
    max_attempts: int


class _StepSpecRequired(TypedDict):
    name: str


class StepSpec(_StepSpecRequired, total=False):
    """One step as submitted: `agent` or `http`."""

    agent: str
    http: HttpTarget
    payload: Json
    depends_on: List[str]
    timeout: str
    deadline: str
    max_attempts: int
    backoff: Backoff
    backoff_formula: Literal["exponential", "faktory"]
    compensate: CompensateSpec
    progress_events: bool


class _JobSpecRequired(TypedDict):
    steps: List[StepSpec]


class JobSpec(_JobSpecRequired, total=False):
    """A job as submitted (`Client.submit`)."""

    idempotency_key: str
    labels: Dict[str, str]
    priority: int
    run_at: str
    ordering_key: str
    callback_url: str
    on_failure: Literal["compensate", "hold", "fail", "compensate_and_retry"]
    deadline: str
    job_attempts: int
    job_backoff: Backoff
    job_exhausted: Literal["fail", "hold"]
    retention: str


class _StepRequired(TypedDict):
    name: str
    agent: str
    state: str
    depends_on: List[str]
    attempt: int
    failures: int
    max_attempts: int
    timeout: str
    payload: Json
    created_at: str


class Step(_StepRequired, total=False):
    """A step as the API shows it."""

    deadline: str
    worker: Optional[str]
    ready_at: Optional[str]
    started_at: Optional[str]
    finished_at: Optional[str]
    lease_expires_at: Optional[str]
    next_attempt_at: Optional[str]
    result: Json
    last_error: Optional[str]
    compensate: Optional[CompensateSpec]
    comp_phase: Optional[str]
    comp_attempts: int
    comp_failures: int
    http: HttpTarget
    progress: Json
    progress_at: str
    progress_events: bool
    waiting_reason: WaitingReason


class _JobRequired(TypedDict):
    id: str
    state: str
    desired_state: str
    labels: Dict[str, str]
    priority: int
    on_failure: str
    created_at: str
    updated_at: str
    steps: List[Step]


class Job(_JobRequired, total=False):
    """A job as the API shows it (`Client.get`, `Client.wait`)."""

    idempotency_key: Optional[str]
    run_at: Optional[str]
    ordering_key: Optional[str]
    finished_at: Optional[str]
    blocked_reason: Optional[str]
    compensated: List[str]
    callback_url: Optional[str]
    submitted_by: Optional[str]
    retention: str
    removable_at: str
    deadline: str
    round: int
    job_attempts: int
    job_exhausted: Literal["fail", "hold"]
    rerun_of: str
    rerun_by: str
    waiting_reason: WaitingReason


class RerunRequest(TypedDict, total=False):
    """`POST /v1/jobs/{id}/rerun` body (`Client.rerun`)."""

    from_failed: bool
    by: str
    reason: str
