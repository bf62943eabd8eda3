"""Sphinx configuration of the client SDK's API reference, built by ``make docs-api`` (into
``build/docs-api``) from the package's numpy-style docstrings; any warning fails the build."""

from __future__ import annotations

project = "FedFaaS client"
author = "FedFaaS"
extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon"]
napoleon_google_docstring = False
napoleon_numpy_docstring = True
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": True, "show-inheritance": True}
# the modules of the [torch] extra are documented without it installed
autodoc_mock_imports = ["torch", "sklearn"]
exclude_patterns = ["_build"]
html_theme = "alabaster"
