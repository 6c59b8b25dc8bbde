"""Schema 3: a measurement's timing regime (`regime`: text, `RegimeSpec.name`; 'sustained' for
every row before it, all of which ran their calls back to back or as single launches). `confirm
--regime` stores a problem's candidates once per regime, and `load_best` ranks a problem by its
sustained rows only, reading the others as per-regime figures. Adding a column with a constant
default rewrites no row.

`ct_meta`'s schema becomes 3, so that versions before it, which would rank a regime's rows as
if they were sustained ones, refuse the store instead.
"""

import sqlalchemy as sa
from alembic import op

revision = "schema3"
down_revision = "schema2"


def upgrade() -> None:
    op.add_column("ct_measurements", sa.Column("regime", sa.Text, nullable=False, server_default="sustained"))
    meta = sa.table("ct_meta", sa.column("key", sa.String), sa.column("value", sa.Text))
    bind = op.get_bind()
    if bind.execute(sa.select(meta.c.value).where(meta.c.key == "schema")).first() is None:
        bind.execute(meta.insert().values(key="schema", value="3"))
    else:
        bind.execute(meta.update().where(meta.c.key == "schema").values(value="3"))
