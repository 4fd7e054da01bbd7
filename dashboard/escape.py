"""Names from the API shown as text, never as Markdown.

Streamlit renders Markdown in `st.markdown`, `st.write`, captions, alerts, subheaders and in the labels of
expanders, metrics, tabs and widgets: links, images, LaTeX between `$`, emoji shortcodes and `:red[...]`
colour directives. A GPU model, team, job, node or user name comes from telemetry, which an attacker can write, so
a model named `[Sign in again](http://evil.example)` would show as a phishing link inside the dashboard. Every value
from the API that goes into such a string passes through `md` first.
"""
from __future__ import annotations

import re

# CommonMark's specials, plus what Streamlit adds on top of it: `$` (LaTeX), `:` (emoji shortcodes, `:red[...]`,
# `:material/...:`) and `&` (HTML entities such as `&lt;`). CommonMark turns a backslash before any ASCII
# punctuation into that character, so each shows as itself.
MARKDOWN_SPECIALS = "\\`*_{}[]()#+-.!|<>~$:&"
_SPECIAL = re.compile("([" + re.escape(MARKDOWN_SPECIALS) + "])")
_LINE_BREAK = re.compile(r"\r\n|\r|\n|\u2028|\u2029")
# GitHub-flavoured Markdown also links a bare `http://…` or `www.…` after escapes are resolved, so an invisible
# WORD JOINER goes where those patterns need two characters side by side: between a scheme's `:` and `//`, and
# between `www` and its `.`. The name reads the same, and links to no site. (A bare e-mail address still becomes a
# `mailto:` link showing exactly that address: nothing deceptive, and user names are often e-mail addresses that
# people search for and copy, which an invisible character would break.)
JOINER = "\u2060"
_AUTOLINK = re.compile(r"(?<=\\:)(?=//)|(?i:(?<=www)(?=\\\.))")


def md(value: object) -> str:
    """`value` as text that Streamlit's Markdown shows literally: every special character backslash-escaped and
    line breaks turned into spaces (a label is one line; a new line could start a heading or a list), and bare
    URLs broken by an invisible `JOINER` so that none becomes a link."""
    return _AUTOLINK.sub(JOINER, _SPECIAL.sub(r"\\\1", _LINE_BREAK.sub(" ", str(value))))
