"""Markers of the remote tests. `binding` marks the tests that load libringfeed.so into Python:
the ASan stage of make test leaves them out (a sanitized library cannot be loaded into an
unsanitized interpreter) and the release stage runs them."""


def pytest_configure(config):
    config.addinivalue_line("markers", "binding: loads the Python binding (needs RINGFEED_LIBRARY)")
