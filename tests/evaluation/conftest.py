import pytest


def pytest_collection_modifyitems(items):
    for item in items:
        if "/evaluation/test_engine_" in str(item.fspath):
            item.add_marker(pytest.mark.engine)
