"""An unpublished outbox row of a long transaction is due from its COMMIT, not its start

Revision ID: 0010
Revises: 0008 (the lead rechains it after 0009 on merge)
Create Date: 2026-12-01 16:00:00.000000

A transition stamps its outbox row with PostgreSQL's ``now()``: the start of its
transaction. The relay leaves a row to its producer's fast path for a grace counted from
that stamp, so rows written inside a long transaction (a Django ``atomic()`` block, an
``enqueue.transaction()`` batch) were due the moment they committed, and the relay sent
them a second time while the producer was sending them. A deferred constraint trigger
runs at COMMIT: when the transaction has lasted longer than 0.5 s, its unpublished rows
whose due time has already passed are made due at the COMMIT, so the grace counts from
there. A shorter transaction pays one function call per row and no write. SQLite has no
deferred trigger: there the grace still counts from the statement (docs/reliability.md).
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Rows of a transaction shorter than 0.5 s stay as stamped: they are due at most that much
# earlier than COMMIT plus the relay's grace (2 s), while the fast path marks its rows
# within ``marker.FLUSH_INTERVAL`` (0.05 s).
FUNCTION = """
CREATE FUNCTION outbox_due_from_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF clock_timestamp() - now() < interval '0.5 seconds' THEN
        RETURN NULL;
    END IF;
    -- Guarded by the old due time: the trigger this UPDATE queues in turn changes nothing.
    UPDATE outbox SET available_at = clock_timestamp()
     WHERE id = NEW.id AND published_at IS NULL
       AND available_at < clock_timestamp() - interval '0.5 seconds';
    RETURN NULL;
END
$$
"""

TRIGGER = """
CREATE CONSTRAINT TRIGGER outbox_due_from_commit
    AFTER INSERT OR UPDATE OF available_at ON outbox
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW WHEN (NEW.published_at IS NULL)
    EXECUTE FUNCTION outbox_due_from_commit()
"""


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(FUNCTION)
    op.execute(TRIGGER)


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("DROP TRIGGER outbox_due_from_commit ON outbox")
    op.execute("DROP FUNCTION outbox_due_from_commit()")
