import pytest

from dspark_testlib import TEST_ONLY_ENV


@pytest.fixture(scope="module")
def users_environment():
    """This module's servers see what a user's shell has: no :data:`TEST_ONLY_ENV`."""
    mp = pytest.MonkeyPatch()
    for k in TEST_ONLY_ENV:
        mp.delenv(k, raising=False)
    yield
    mp.undo()


def pytest_collection_modifyitems(items):
    for item in items:
        if "/integration/" in str(item.fspath):
            item.add_marker(pytest.mark.engine)
