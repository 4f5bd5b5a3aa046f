"""POST /v1/messages/batch: many messages in one request and one transaction (issue 12).

Each item is judged alone, as POST /v1/messages would judge it (schema, new_message,
rendering, sender identity): a bad item gets its own problem in the answer and the others
are written. Only a bad envelope (no `messages` list, none, more than 1,000) refuses the
whole request. An item may carry its own `idempotency_key` (the message's, as the header
is for a single POST): a key some message already holds answers `existing` with that
message; a key two items of one batch share is refused on the second.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Response
from fastapi.exceptions import RequestValidationError
from pydantic import (
    BaseModel,
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
)
from pydantic.functional_validators import WrapValidator
from pydantic_core import PydanticCustomError

from mailbag.api.deps import CallDep
from mailbag.api.messages import message_from
from mailbag.api.problems import COMMON, Problem, documented, problem_for
from mailbag.api.replay import replayed
from mailbag.api.schemas import MessageCreate, MessageOut, Strict
from mailbag.domain.message import InvalidMessage
from mailbag.services.batch import MAX_ITEMS, OPERATION, Batches, Item
from mailbag.services.container import Services
from mailbag.services.idempotency import KEY_PATTERN

router = APIRouter(prefix="/v1/messages", tags=["messages"])


class BatchItem(MessageCreate):
    """One message of a batch: the body of POST /v1/messages, and its own key; bulk mail
    unless it says `"bulk": false`."""

    bulk: bool = Field(
        True,
        description="Bulk mail unless false: a batch's messages are claimed after "
        "transactional mail (a quarter of its share), never starved by it.",
        examples=[True],
    )
    idempotency_key: str | None = Field(
        None,
        min_length=1,
        max_length=255,
        pattern=KEY_PATTERN.pattern,
        description="This message's idempotency key (1 to 255 printable ASCII characters), "
        "as the Idempotency-Key header is for POST /v1/messages: a key a message already "
        "holds answers `existing` with that message.",
        examples=["welcome-42"],
    )


class InvalidItem:
    """An item that is not a BatchItem: what pydantic found wrong, and the item as given."""

    def __init__(self, errors: list[Any], given: Any) -> None:
        self.errors, self.given = errors, given


def _judged_alone(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    # One item's schema error is that item's answer, not the whole request's.
    try:
        return handler(value)
    except ValidationError as exc:
        return InvalidItem(exc.errors(), value)


class BatchCreate(Strict):
    messages: list[Annotated[BatchItem, WrapValidator(_judged_alone)]] = Field(
        min_length=1,
        description=f"1 to {MAX_ITEMS} messages, each as the body of POST /v1/messages "
        "with an optional `idempotency_key`.",
    )

    @field_validator("messages", mode="before")
    @classmethod
    def _at_most(cls, value: Any) -> Any:
        # Before any item is validated: a body of a million items costs one len().
        if isinstance(value, list) and len(value) > MAX_ITEMS:
            raise PydanticCustomError(
                "too_long",
                "has {given} items; a batch holds at most {limit}",
                {"given": len(value), "limit": MAX_ITEMS},
            )
        return value


class ItemResult(BaseModel):
    index: int = Field(description="The item's position in `messages`, from 0.")
    result: Literal["created", "existing", "invalid"]
    message: MessageOut | None = Field(
        None, description="The message created, or the one that already holds the item's key."
    )
    error: Problem | None = Field(
        None, description="Why the item was not written: the problem POST /v1/messages answers."
    )


class BatchOut(BaseModel):
    created: int
    existing: int
    invalid: int
    results: list[ItemResult] = Field(description="One per item, in the order given.")


@router.post(
    "/batch",
    response_model=BatchOut,
    response_model_by_alias=True,
    responses=documented(*COMMON, 409),
)
async def create_batch(body: BatchCreate, call: CallDep, response: Response) -> Any:
    """Put up to 1,000 emails into the outbox in one transaction. The answer (200) has one
    result per item, in order: `created`, `existing` (its `idempotency_key` was taken) or
    `invalid` with the problem POST /v1/messages would answer for it; the valid items are
    written even when others are invalid. With an Idempotency-Key the batch is idempotent
    as a whole: the same key and body replay the first answer, another body is a 409."""
    items: list[Item] = []
    keys: dict[str, int] = {}  # an item's key -> the first item with it
    for index, given in enumerate(body.messages):
        items.append(_item(given, index, keys, call.svc, call.tenant.id))
    result = await Batches(call.svc.engine, call.svc.settings).create(
        tenant_id=call.tenant.id, key=call.key, items=items, problem=_problem, now=call.now
    )
    return replayed(result, response, OPERATION)


def _item(
    given: BatchItem | InvalidItem, index: int, keys: dict[str, int], svc: Services, tenant: str
) -> Item:
    if isinstance(given, InvalidItem):
        return Item(None, _problem(RequestValidationError(given.errors)), given.given)
    raw = given.model_dump(mode="json", by_alias=True)
    try:
        if given.idempotency_key is not None and given.idempotency_key in keys:
            first = keys[given.idempotency_key]
            raise InvalidMessage({"idempotency_key": f"item {first} of this batch has it too"})
        message = message_from(given, svc, tenant_id=tenant, key=given.idempotency_key)
    except InvalidMessage as exc:  # MessageTooLarge too
        return Item(None, _problem(exc), raw)
    if given.idempotency_key is not None:
        keys[given.idempotency_key] = index
    return Item(message)


def _problem(exc: Exception) -> dict[str, Any]:
    """The problem body the API answers `exc` with (the app's one table of them)."""

    return problem_for(exc).body()
