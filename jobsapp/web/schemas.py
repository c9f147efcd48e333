"""The shapes of the web API: what a route takes (query, headers, body) and what it answers.

One declaration serves twice: a route names these models in its signature or its
``responses``, flask-openapi3 validates the request against them before the view runs, and
``/openapi.json`` is generated from the same models. A request part that fails its model
is answered 400 ``{"error": <the part's code>, "reason": ...}`` (``jobsapp.web.openapi``).

Answers are closed shapes (every field required, no others allowed): a field the service
adds must be declared here before it ships, or the e2e tests that check bodies against
the document fail.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal
from uuid import UUID

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from jobsapp.maintenance import reconcile
from jobsapp.monitor import summary
from jobsapp.web.urls import VARIANT_NAME

AttachmentState = Literal["queued", "processing", "ready", "failed"]
RunState = Literal["queued", "running", "succeeded", "failed"]
# A filter: the states, with cancelled and expired runs apart from the failures.
StateFilter = Literal["queued", "running", "succeeded", "failed", "cancelled", "expired"]
# More digits than any count we take, fewer than int()'s own limit on string conversion.
_MAX_DIGITS = 9

# The code each request model's refusal answers with, by model name (what pydantic's
# ValidationError carries): filled as the models are declared.
ERROR_CODES: dict[str, str] = {}


# ------------------------------------------------------------------ request parts


class RequestPart(BaseModel):
    """A part of a request a route declares; a refusal answers 400 with ``refusal_code``."""

    refusal_code: ClassVar[str] = "bad_request"

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        ERROR_CODES[cls.__name__] = cls.refusal_code


class Filters(RequestPart):
    """Query-string filters: a refusal is ``bad_filter``."""

    refusal_code: ClassVar[str] = "bad_filter"


class Body(RequestPart):
    """A JSON body: an object with exactly the declared members, each of its exact type."""

    model_config = ConfigDict(extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _not_a_string(cls, raw: object, info: ValidationInfo) -> object:
        # flask-openapi3 parses a body that is a JSON string as JSON once more: a string
        # is not an object, whatever it holds.
        if info.mode == "json":
            raise ValueError("a JSON string, not an object")
        return raw


def _count(raw: object, info: ValidationInfo) -> object:
    # The one parse of a number in a URL. str.isdigit() alone takes "²" and "٣", which
    # int() refuses, and int() of thousands of digits is slow: ASCII digits, few of them.
    if not isinstance(raw, str):
        return raw
    if not (raw.isascii() and raw.isdigit() and len(raw) <= _MAX_DIGITS):
        raise ValueError(
            f"{info.field_name} must be a whole number in ASCII digits (at most {_MAX_DIGITS})"
        )
    return int(raw)


# Every number of a query string is parsed by _count (its range, declared before it, is
# checked after it and shown in the document).
ASCII_COUNT = BeforeValidator(_count)
Limit = Annotated[
    int, Field(ge=1, le=summary.MAX_LIMIT, description="How many rows, newest first."), ASCII_COUNT
]


class DeadOutboxQuery(Filters):
    limit: Limit = summary.DEFAULT_LIMIT


class SummaryQuery(Filters):
    state: list[StateFilter] = Field(
        default=[],
        description="Only these states (`failed` leaves out cancelled and expired "
        "runs, which `cancelled` and `expired` select); repeat the parameter or separate by "
        "commas.",
    )
    module: str | None = Field(
        default=None, description="Only this run table (`jobs`, `attachments`, ...)."
    )
    limit: Limit = summary.DEFAULT_LIMIT

    @field_validator("state", mode="before")
    @classmethod
    def _states(cls, raw: object) -> list[str]:
        values = raw if isinstance(raw, list) else [raw]
        states = [s for value in values for s in str(value).split(",") if s]
        return list(summary.checked_states(states or None))

    @field_validator("module", mode="before")
    @classmethod
    def _module(cls, raw: object) -> str | None:
        module = str(raw) if raw else None
        summary.checked_tables(module)
        return module


class UploadHeaders(RequestPart):
    refusal_code: ClassVar[str] = "bad_idempotency_key"

    idempotency_key: (
        Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[\x20-\x7E]+$")] | None
    ) = Field(
        default=None,
        alias="Idempotency-Key",
        description="Repeating a key returns the attachment accepted first; printable ASCII.",
    )


class OperatorAction(Body):
    reason: Annotated[StrictStr, Field(min_length=1, max_length=500)]
    actor: Annotated[StrictStr, Field(min_length=1, max_length=100)] = Field(
        default="api",
        description="Who acts (self-declared; default `api`); audited as `operator:<actor>`.",
    )


class CancelAction(OperatorAction):
    terminate: StrictBool = Field(
        default=False,
        description="A running job: also send Celery's terminate to its attempt (the "
        "fallback for a body that never returns to Python; prefork pool). Asked again of a "
        "job already told to stop, it is sent again, audited.",
    )


class RetryDeadOutbox(OperatorAction):
    ids: list[StrictInt] | None = Field(
        default=None, description="Outbox row ids; none: every dead row."
    )


class ReconcileRequest(Body):
    # The whole body may be left out: a pass over every domain and code.
    model_config = ConfigDict(openapi_extra={"required": False})  # type: ignore[typeddict-unknown-key]

    actor: StrictStr = "api"
    module: StrictStr | None = None
    error_code: StrictStr | None = None
    dry_run: StrictBool = False

    @model_validator(mode="before")
    @classmethod
    def _no_body(cls, raw: object) -> object:
        return {} if raw is None else raw


class JobPath(BaseModel):
    module: str = Field(description="The run table: `jobs`, `attachments`, ...")
    job_id: UUID


class AttachmentPath(BaseModel):
    attachment_id: UUID


class VariantPath(AttachmentPath):
    # Another name is no route (404): the converter takes only what a pipeline could declare.
    name: str = Field(pattern=f"^{VARIANT_NAME}$", description="A variant, e.g. `thumbnail`")


# ------------------------------------------------------------------------ answers


class Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Error(Closed):
    error: str = Field(description="A stable machine-readable code")
    reason: str = Field(description="For humans")


class Health(Closed):
    status: Literal["ok"]


class Links(Closed):
    self_: str = Field(alias="self")
    variants: dict[str, str]


class Accepted(Closed):
    id: UUID
    state: AttachmentState
    links: Links


class Variant(Closed):
    name: str
    pipeline_version: int
    sha256: str
    size: int
    width: int
    height: int
    content_type: str
    url: str


class Original(Closed):
    sha256: str
    size: int


class AttachmentJob(Closed):
    module: str
    job_id: UUID
    attempt: int
    state: RunState


class Attachment(Closed):
    id: UUID
    state: AttachmentState
    content_type: str
    size: int
    sha256: str
    width: int
    height: int
    display_name: str
    published_version: int | None
    error_code: str | None
    created_at: datetime
    updated_at: datetime
    original: Original | None = Field(
        description="The upload as received; it is not served (it keeps EXIF)."
    )
    variants: list[Variant]
    links: Links
    job: AttachmentJob | None = Field(
        description="The attachment's current job (its newest run), for operators."
    )


NonNegative = Annotated[int, Field(ge=0)]


class JobRow(Closed):
    module: str
    job_id: UUID
    task_name: str
    state: RunState
    outcome: str | None
    attempts: NonNegative
    max_attempts: Annotated[int, Field(ge=1)]
    age_seconds: Annotated[float, Field(ge=0)]
    last_error: str | None = Field(description="Its first line only")
    created_at: datetime
    updated_at: datetime
    worker: str | None


class PerState(Closed):
    queued: NonNegative
    running: NonNegative
    succeeded: NonNegative
    failed: NonNegative


class JobSummary(Closed):
    jobs: list[JobRow]
    counts: dict[str, PerState] = Field(
        description="module -> state -> rows: queued and running at request time, succeeded "
        "and failed as of beat's last rollup pass, until retention deletes them"
    )


class Replayed(Closed):
    module: str
    job_id: UUID
    state: Literal["queued"]
    attempt: Annotated[int, Field(ge=1)]
    published: bool = Field(description="false: the broker was not reached; the relay publishes it")
    waiting: bool = Field(
        False,
        description="true: its limited key's slots are all held; it is published when one frees",
    )


class Cancelled(Closed):
    module: str
    job_id: UUID
    state: Literal["failed", "running"] = Field(
        description="`failed`: it was queued and is cancelled; `running`: it is told to stop"
    )
    outcome: Literal["cancelled"] | None
    attempts: NonNegative
    cancel_requested: bool = Field(
        description="true: the running attempt stops at its next heartbeat and its job ends "
        "failed/cancelled (its success refused)"
    )
    terminate_sent: bool = Field(description="Celery's terminate went to the running attempt")


class DeadRow(Closed):
    id: int
    module: str
    job_id: UUID
    attempt: int
    task_name: str
    publish_count: NonNegative
    publish_failures: NonNegative
    last_error: str | None
    created_at: datetime
    dead_at: datetime


class DeadOutbox(Closed):
    total: NonNegative
    dead: list[DeadRow]


class Revived(Closed):
    revived: NonNegative


class Retaken(Closed):
    job_id: UUID
    error_code: str


class HeldBack(Closed):
    job_id: UUID
    rule: reconcile.Rule
    why: str = Field(description="The rule in one line, e.g. 'cool-down until <time>'")


class ReconcilePass(Closed):
    module: str
    pass_id: str
    dry_run: bool
    retaken: list[Retaken]
    refused: dict[str, NonNegative] = Field(description="Candidates not taken, by why")
    cut_short: bool = Field(description="The budget ran out; the next pass continues")
    held_back: list[HeldBack] = Field(
        description="A dry run: the domain's newest failed runs it leaves alone, each with "
        "the rule that holds it back (empty when not a dry run)"
    )
    held_back_more: bool = Field(description="More failed runs are left alone than listed")


class Reconciled(Closed):
    passes: list[ReconcilePass]


# ------------------------------------------------------------------ flow control


class FlowPath(BaseModel):
    kind: Literal["queue", "domain"] = Field(description="`queue` (a broker queue) or `domain`")
    name: str = Field(description="The queue's name, or the domain's module (`jobs`, ...)")


class PausedItem(Closed):
    kind: Literal["queue", "domain"]
    name: str
    paused_at: datetime
    paused_by: str = Field(description="Who paused it: `operator:<actor>`")
    reason: str | None


class FlowAction(Closed):
    id: int
    action: Literal["pause", "resume"]
    kind: Literal["queue", "domain"]
    name: str
    actor: str
    reason: str | None
    at: datetime


class FlowState(Closed):
    paused: list[PausedItem]
    history: list[FlowAction] = Field(description="The newest pauses and resumes first")


class FlowChanged(Closed):
    kind: Literal["queue", "domain"]
    name: str
    paused: bool = Field(description="Whether it is paused now")
    changed: bool = Field(description="False: it already was (nothing written)")
