"""Make the lock table compare text exactly on MariaDB/MySQL.

Their default collations (``utf8mb4_general_ci`` and friends) compare text
case- and accent-insensitively and ignore trailing spaces, so two
``KEY_PREFIX`` values or lock names that differ only that way would be listed
and cleared together. This converts the table (existing rows included) to
utf8mb4 with a binary collation that does not pad: ``utf8mb4_nopad_bin`` on
MariaDB, ``utf8mb4_0900_bin`` on MySQL 8.0.17+ (``utf8mb4_bin``, which still
ignores trailing spaces, where neither exists). It also becomes the table's
default collation, so later column changes keep it.

PostgreSQL (deterministic collations) and SQLite (``BINARY``) already compare
exactly: there, and on any other database, this does nothing. The model state
does not change. Reversing leaves the collation as it is.
"""

from django.db import migrations

#: Binary, no-pad utf8mb4 collations, the first one the server has wins.
COLLATIONS = ("utf8mb4_nopad_bin", "utf8mb4_0900_bin", "utf8mb4_bin")


def exact_collation(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "mysql":
        return
    table = apps.get_model("django_distlock", "LockRecord")._meta.db_table
    with connection.cursor() as cursor:
        if table not in connection.introspection.table_names(cursor):
            return  # a router kept the table off this database
        cursor.execute(
            "SELECT COLLATION_NAME FROM information_schema.COLLATIONS "
            "WHERE COLLATION_NAME IN (%s, %s, %s)",
            COLLATIONS,
        )
        available = {row[0] for row in cursor.fetchall()}
    collation = next(c for c in COLLATIONS if c in available)
    schema_editor.execute(
        f"ALTER TABLE {schema_editor.quote_name(table)} "
        f"CONVERT TO CHARACTER SET utf8mb4 COLLATE {collation}"
    )


class Migration(migrations.Migration):
    dependencies = [
        ("django_distlock", "0001_initial"),
    ]

    operations = [
        migrations.RunPython(
            exact_collation,
            migrations.RunPython.noop,
            # MySQL cannot roll DDL back: Django refuses it inside a transaction.
            atomic=False,
            hints={"model_name": "lockrecord"},
            elidable=False,
        ),
    ]
