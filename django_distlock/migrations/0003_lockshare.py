"""The table of shared holders, semaphore permits and queued waiters.

On MariaDB/MySQL the new table gets the binary, no-pad collation that
migration 0002 gave the lock table: the backend joins the two on ``digest``,
and two columns of different collations cannot be compared there.
"""

from django.db import migrations, models

#: Binary, no-pad utf8mb4 collations, the first one the server has wins.
COLLATIONS = ("utf8mb4_nopad_bin", "utf8mb4_0900_bin", "utf8mb4_bin")


def exact_collation(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "mysql":
        return
    table = apps.get_model("django_distlock", "LockShare")._meta.db_table
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
        ("django_distlock", "0002_lockrecord_exact_collation"),
    ]

    operations = [
        migrations.CreateModel(
            name="LockShare",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True,
                        primary_key=True,
                        serialize=False,
                        verbose_name="ID",
                    ),
                ),
                ("digest", models.CharField(db_index=True, max_length=64)),
                ("kind", models.CharField(max_length=8)),
                ("permits", models.IntegerField(blank=True, null=True)),
                ("token", models.CharField(max_length=32, unique=True)),
                ("fence", models.BigIntegerField(default=0)),
                ("host", models.CharField(blank=True, default="", max_length=255)),
                ("pid", models.IntegerField(blank=True, null=True)),
                ("thread", models.CharField(blank=True, default="", max_length=255)),
                ("acquired_at", models.DateTimeField(blank=True, null=True)),
                ("expires_at", models.DateTimeField()),
            ],
            options={
                "verbose_name": "lock share",
                "db_table": "django_distlock_lockshare",
            },
        ),
        migrations.RunPython(
            exact_collation,
            migrations.RunPython.noop,
            # MySQL cannot roll DDL back: Django refuses it inside a transaction.
            atomic=False,
            hints={"model_name": "lockshare"},
            elidable=False,
        ),
    ]
