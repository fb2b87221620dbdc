"""The library's first import in a server process, once, under a lock, before a page that uses it runs.

Two sessions' first page runs on a just-started server imported torch, transformers and the library at the same
time, and Python's import deadlock avoidance handed one of them a half-initialized transformers module: "cannot
import name 'AutoConfig' from 'transformers'" or "module 'transformers' has no attribute 'ViTConfig'", on the
Symmetry matrix beside a model load (4 of 4 fresh processes failed so with three such threads). Home imports none of
it, so a server's first Home stays fast; every other page comes through `library_imported` first."""

from __future__ import annotations

import threading

# The import runs in a thread of its own, not in a session's: a session's run can be stopped mid-way (its visitor
# clicks again), and an import stopped half-way leaves half-initialized transformers modules behind for everyone
# (with the import in the first session's run and a lock around it, 3 of 3 just-started servers still lost a class).
_done = threading.Event()
_starting = threading.Lock()
_started = False
_failure: BaseException | None = None


def _import_library() -> None:
    global _failure
    try:
        import transformers

        from perm_core.models import random_models, registry  # noqa: F401 - imported here, once

        for name in sorted({*random_models.DEFAULT_CLASSES.values(), "AutoConfig", "AutoModel"}):
            getattr(transformers, name)
        for make_config in random_models.CONFIGS.values():
            make_config()
    except BaseException as error:  # noqa: BLE001 - said to every page that waits for it
        _failure = error
    finally:
        _done.set()


def library_imported() -> None:
    """Import torch, transformers and the library's model modules, and resolve the transformers classes the random
    families build from (transformers imports each lazily, on first use), once per process, in one thread of its
    own; every caller waits for it. RuntimeError if that import failed."""
    global _started
    if not _done.is_set():
        with _starting:
            if not _started:
                threading.Thread(target=_import_library, name="first-imports", daemon=True).start()
                _started = True
        _done.wait()
    if _failure is not None:
        raise RuntimeError(f"the library could not be imported: {_failure}") from _failure
