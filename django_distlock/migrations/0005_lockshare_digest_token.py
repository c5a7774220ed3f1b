"""One unique index on the share table's (digest, token) instead of four.

Every statement of the database backend that looks up a holder or waiter
in ``LockShare`` names its digest, so one index over (digest, token) serves
them all and keeps a token unique per name. It replaces an index on
``digest`` and a unique ``token`` (and, on PostgreSQL, their
``varchar_pattern_ops`` copies for LIKE, which no query uses): on
PostgreSQL every lease, permit and queued place inserted or deleted updates
two indexes instead of five (on MariaDB/MySQL, two instead of three).
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_distlock", "0004_share_functions"),
    ]

    operations = [
        migrations.AlterField(
            model_name="lockshare",
            name="digest",
            field=models.CharField(max_length=64),
        ),
        migrations.AlterField(
            model_name="lockshare",
            name="token",
            field=models.CharField(max_length=32),
        ),
        migrations.AddConstraint(
            model_name="lockshare",
            constraint=models.UniqueConstraint(
                fields=("digest", "token"), name="distlock_share_digest_token"
            ),
        ),
    ]
