"""Alembic's environment for a store's migrations. `store._migrate.upgrade` runs it on a
connection it holds in a transaction of its own (under the store's migration lock), so every
step of an upgrade commits or rolls back together."""

from alembic import context

from cutlass_tune.store._migrate import VERSION_TABLE

if context.is_offline_mode():
    raise NotImplementedError("a store's migrations run on the store itself (cutlass-tune upgrade), not as SQL text")
context.configure(connection=context.config.attributes["connection"], version_table=VERSION_TABLE,
                  transactional_ddl=True)
with context.begin_transaction():  # the caller's transaction: alembic opens none of its own
    context.run_migrations()
