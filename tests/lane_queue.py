"""The work queue `make test`'s two lanes share (`pytest -p lane_queue --lane-queue DIR`):
both lanes collect the same test files and go through them in the same order; a lane runs a
file's tests only if it is first to claim the file (a file created in DIR, O_EXCL), so each
file runs once, whole (its module fixtures once), in whichever lane reaches it first (the
other lane's files do not show in a lane's counts). The
lanes end within one file's time of each other however the tests' times change."""
from __future__ import annotations

import os
from pathlib import Path

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--lane-queue", metavar="DIR", required=True,
                     help="the folder where the lanes sharing this queue claim test files")


class Claims:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.owned: dict[str, bool] = {}

    def mine(self, path: str) -> bool:
        """Whether this lane runs the file: claimed now by this lane, or before."""
        if path not in self.owned:
            claim = self.folder / (path.replace(os.sep, "__") + ".claim")
            try:
                os.close(os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                self.owned[path] = True
            except FileExistsError:
                self.owned[path] = False
        return self.owned[path]


def pytest_configure(config: pytest.Config) -> None:
    folder = Path(config.getoption("--lane-queue"))
    folder.mkdir(parents=True, exist_ok=True)
    config.stash[CLAIMS] = Claims(folder)


CLAIMS = pytest.StashKey[Claims]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> bool | None:
    """pytest's loop over this lane's items only: each item's `nextitem` (what its teardown
    keeps set up for) is the next one this lane runs, whose file is claimed just before."""
    if session.config.option.collectonly or (
            session.testsfailed and not session.config.option.continue_on_collection_errors):
        return None  # pytest's own loop lists the items or reports the collection errors
    claims = session.config.stash[CLAIMS]
    mine = (item for item in session.items if claims.mine(item.location[0]))
    item = next(mine, None)
    while item is not None:
        nextitem = next(mine, None)
        item.config.hook.pytest_runtest_protocol(item=item, nextitem=nextitem)
        if session.shouldfail:
            raise session.Failed(session.shouldfail)
        if session.shouldstop:
            raise session.Interrupted(session.shouldstop)
        item = nextitem
    return True


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    owned = config.stash[CLAIMS].owned
    terminalreporter.write_line(f"lane queue: this lane ran {sum(owned.values())} of the "
                                f"{len(owned)} files it collected; the other lane, the rest")
