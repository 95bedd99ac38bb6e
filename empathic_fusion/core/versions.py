"""Installed package versions for feature signatures, read from package metadata without importing the
package (a heavy import, or one that is not there)."""
from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

NOT_INSTALLED = "*"  # an extractor's version where its package is missing: any recorded version matches


def installed_version(distribution: str) -> str:
    """A package's installed version, or `NOT_INSTALLED`. A machine without an extractor (a GPU node
    training on a store extracted elsewhere) then reads a stored branch as the version recorded with it
    (features/extract.py `signature_matches`); extracting anything there fails for want of the package."""
    try:
        return version(distribution)
    except PackageNotFoundError:
        return NOT_INSTALLED
