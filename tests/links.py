"""What the link tests plant links to: a file and a directory outside the run directory,
which must stay as they are."""

from __future__ import annotations

SECRET = "the outside file's own text\n"
