"""Under `make test` (pytest-xdist, --dist loadgroup) every test of the tiny dataset runs in one worker,
so the dataset and its store are built once per suite, not once per worker: xdist groups a test by
appending its group to the node id, which the pinned pytest reads (pytest 9 did not, and each worker
built them again)."""
from __future__ import annotations

import pytest


def test_tests_of_the_tiny_dataset_share_one_worker(tiny_dataset, request):
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not run with --dist loadgroup (make test): one process, nothing to group")
    assert request.node.nodeid.endswith("@tiny_dataset"), request.node.nodeid
