#!/usr/bin/env python
"""Django's command-line utility for the demo project."""

import os
import sys
from pathlib import Path

# Run from a checkout without installing: the package sits beside testproject/.
sys.path.append(str(Path(__file__).resolve().parent.parent))


def main():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
