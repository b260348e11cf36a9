"""The app's folder as `flwr run` should read it: the source, without virtual environments.

``flwr run <folder>`` lists every file under the folder, following Flower's own filters only
afterwards: a virtual environment inside the checkout (``.venv``, CI's) is tens of thousands of
files and several CPU-seconds on every submission, before any of them is dropped. The tools
submit a copy of the folder that leaves out what can never be app source (virtual
environments, ``.git``, ``__pycache__``); Flower's filters then build the same FAB from it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

#: Folders that are never an app's source, whatever the app's .gitignore says.
NEVER_SOURCE = frozenset({".git", "__pycache__"})


def source_files(app: Path) -> Iterator[Path]:
    """Every file under ``app`` (relative paths) but those in a virtual environment (a folder
    holding ``pyvenv.cfg``), ``.git`` or ``__pycache__``; symbolic links are left out, as
    Flower leaves them out."""
    app = Path(app)
    for folder, dirs, files in os.walk(app):
        here = Path(folder)
        dirs[:] = [d for d in dirs if d not in NEVER_SOURCE and not (here / d / "pyvenv.cfg").exists()
                   and not (here / d).is_symlink()]
        for name in files:
            if not (here / name).is_symlink():
                yield (here / name).relative_to(app)


@contextmanager
def submittable(app: Path) -> Iterator[Path]:
    """A temporary copy of ``app``'s source files (:func:`source_files`) to hand to
    ``flwr run``; removed on exit. Flower builds the FAB when the run is submitted, so the copy
    is not needed once ``flwr run`` returns."""
    with tempfile.TemporaryDirectory(prefix="fairvfl-app-") as tmp:
        for rel in source_files(app):
            (Path(tmp) / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(Path(app) / rel, Path(tmp) / rel)
        yield Path(tmp)
