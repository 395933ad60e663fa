"""MkDocs hooks (mkdocs.yml, ``hooks:``): what the site does to pages beyond MkDocs' own rendering.

minidist's docstrings name other objects the Sphinx way, ``:class:`DistributedSampler``` or
``:meth:`join```, which reads well in the source and in ``help()``. mkdocstrings renders the code span but
keeps the role's prefix (":meth:" before ``join``); the API pages drop it, leaving the name in code.
"""

import re

ROLE = re.compile(r":(?:class|meth|func|attr|mod|data|exc|obj):(?=<code>)")


def on_page_content(html: str, **kwargs: object) -> str:
    return ROLE.sub("", html)
