"""Sphinx configuration of zring's API reference (``make docs``).

The reference is built from the docstrings of the installed package, so
``make docs`` builds the extension first; it runs with warnings as errors,
so a malformed docstring fails ``make test``.
"""

import zring

project = "zring"
author = "the zring authors"
copyright = "the zring authors, MIT license"
version = release = zring.__version__

extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon"]
# The docstrings use Google-style sections (Args:, Returns:, Raises:).
napoleon_google_docstring = True
napoleon_numpy_docstring = False
# Methods a class inherits from zring's own base classes (close, read_stats,
# fingerprint) are part of its API; those of builtins are not.
autodoc_default_options = {
    "members": True,
    "show-inheritance": True,
    "inherited-members": "BaseException,object,dict",
}
autodoc_member_order = "bysource"
# Signatures in the text; the stubs in the package carry the full types.
autodoc_typehints = "signature"

# Only the reStructuredText pages; guide.md and internals.md are read on GitHub.
source_suffix = {".rst": "restructuredtext"}
exclude_patterns = ["_build"]
html_theme = "alabaster"

# Every cross-reference must resolve (a renamed method fails the build), except
# those to other projects, which are not linked here (no intersphinx: the build
# stays offline), and the private base classes that show-inheritance names.
nitpicky = True
nitpick_ignore_regex = [
    (r"py:.*", r"(numpy|np|os|pathlib|jax|collections|typing|torch|grain)(\..*)?"),
    (r"py:class", r"zring\.(dataset\._Base|adapters\._Source|_util\.Closeable|ray\._TaskResult)"),
    (r"py:.*", r"ray(\..*)?"),
]
html_title = f"zring {release} API reference"
