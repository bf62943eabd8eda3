"""The console's HTML: one shell per page; ``static/console.js`` fills it from the JSON API.

No page holds data in its HTML, and the script writes data only as text (never as markup), so
what a service answers cannot become script on the page; the Content-Security-Policy
(:data:`CSP`) allows scripts and styles from the console alone, no inline script.
"""

from __future__ import annotations

from html import escape

#: the Content-Security-Policy of every answer
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)

#: (path, title) of the pages in the navigation bar
NAV = (
    ("/", "Overview"),
    ("/jobs", "Jobs"),
    ("/flstore", "FLStore"),
    ("/checkpoints", "Checkpoints"),
    ("/dataplane", "Data plane"),
)
#: pages of the admin alone (what they show, the gateways give the admin alone)
ADMIN_PAGES = frozenset({"/dataplane"})


def _head(title: str) -> str:
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{escape(title)} - FedFaaS console</title>"
        "<link rel='stylesheet' href='/static/console.css'>"
    )


def page(name: str, title: str, scope: str, csrf: str, job: str = "") -> str:
    """The shell of page ``name`` (``overview``, ``jobs``, ``job``, ``flstore``,
    ``checkpoints``, ``dataplane``) for a login of ``scope`` with its CSRF token (the
    navigation bar links the admin's pages for the admin alone)."""
    links = "".join(
        f"<a href='{path}'{' class=here' if t == title else ''}>{escape(t)}</a>"
        for path, t in NAV
        if scope == "admin" or path not in ADMIN_PAGES
    )
    return (
        f"{_head(title)}<meta name='csrf-token' content='{escape(csrf)}'>"
        f"<script src='/static/console.js' defer></script></head><body>"
        f"<nav><b>FedFaaS</b>{links}<span class='who'>{escape(scope)}</span>"
        "<button id='logout' type='button'>Log out</button></nav>"
        f"<main id='page' data-page='{escape(name)}' data-job='{escape(job)}' "
        f"data-scope='{escape(scope)}'><h1>{escape(title)}</h1>"
        "<p id='status' class='muted'>loading...</p></main></body></html>"
    )


def login(error: str = "") -> str:
    """The login form: the token goes in a POST body, never in a URL."""
    message = f"<p id='error' class='error'>{escape(error)}</p>" if error else ""
    return (
        f"{_head('Log in')}</head><body><main class='login'><h1>FedFaaS console</h1>{message}"
        "<form method='post' action='/login'>"
        "<label for='token'>Admin or analyst token</label>"
        "<input id='token' name='token' type='password' autocomplete='off' required>"
        "<button id='login' type='submit'>Log in</button></form>"
        "<p class='muted'>The tokens are in the platform's secrets folder "
        "(<code>gateway-admin-secret</code>, <code>analyst-token</code>).</p></main></body></html>"
    )
