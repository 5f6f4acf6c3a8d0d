"""Guard for user-supplied SQL: one read statement, nothing else.

The first line of defence; the second is the server's own ``readonly=1``
setting (per query on a server, a read-only session on chdb). Both are needed:
chdb runs several ``;``-separated statements in one call, and ``SELECT ...
INTO OUTFILE`` writes a file even under ``readonly=1`` in chdb.

The scanner is deliberately conservative: it understands quotes and comments
only well enough never to mistake SQL code for a literal. Anything it cannot
read plainly (an unterminated quote or comment) is refused.
"""

from __future__ import annotations

__all__ = ["ReadOnlySQLError", "check_readonly_sql", "READ_STATEMENTS"]

READ_STATEMENTS = frozenset({"SELECT", "SHOW", "DESCRIBE", "DESC", "EXISTS", "WITH"})
# Words that turn a read into a write or change how results come back.
_FORBIDDEN_WORDS = frozenset({"INTO", "OUTFILE"})


class ReadOnlySQLError(ValueError):
    """The SQL is not a single read statement."""


def _code_tokens(sql: str) -> list[tuple[str, int]]:
    """Tokens of ``sql`` outside comments, with the offset where each ends.

    Bare words come upper-cased; a quoted literal or identifier is one opaque
    token; other non-blank characters are one token each. Raises
    ReadOnlySQLError on an unterminated quote or comment.
    """
    tokens: list[tuple[str, int]] = []
    i, n = 0, len(sql)
    while i < n:
        c = sql[i]
        if c in "'\"`":
            j = i + 1
            while j < n:
                if sql[j] == "\\":
                    j += 2
                    continue
                if sql[j] == c:
                    if j + 1 < n and sql[j + 1] == c:  # doubled quote
                        j += 2
                        continue
                    break
                j += 1
            if j >= n:
                raise ReadOnlySQLError("unterminated quoted literal or identifier")
            tokens.append(("\0quoted", j + 1))
            i = j + 1
        elif sql.startswith("--", i):
            j = sql.find("\n", i)
            i = n if j < 0 else j + 1
        elif sql.startswith("/*", i):
            j = sql.find("*/", i + 2)
            if j < 0:
                raise ReadOnlySQLError("unterminated /* comment")
            i = j + 2
        elif c.isalnum() or c == "_":
            j = i
            while j < n and (sql[j].isalnum() or sql[j] == "_"):
                j += 1
            tokens.append((sql[i:j].upper(), j))
            i = j
        else:
            if not c.isspace():
                tokens.append((c, i + 1))
            i += 1
    return tokens


def check_readonly_sql(sql: str) -> str:
    """Return the one read statement in ``sql`` (trailing ``;`` and comments cut off).

    Allowed: a single SELECT / WITH ... SELECT / SHOW / DESCRIBE (DESC) /
    EXISTS. Refused: anything else, several statements, ``INTO OUTFILE``,
    and a ``FORMAT`` clause (results come back in the client's own format).
    """
    if not isinstance(sql, str) or not sql.strip():
        raise ReadOnlySQLError("empty SQL")
    tokens = _code_tokens(sql)
    # Trailing semicolons end the one statement; any other one starts a second.
    while tokens and tokens[-1][0] == ";":
        tokens.pop()
    words = [t for t, _ in tokens]
    if ";" in words:
        raise ReadOnlySQLError("only one statement is allowed")
    if not words:
        raise ReadOnlySQLError("no statement (only comments)")
    first = words[0]
    if first not in READ_STATEMENTS:
        raise ReadOnlySQLError(
            f"only read statements are allowed ({', '.join(sorted(READ_STATEMENTS))}); got {first!r}"
        )
    for k, w in enumerate(words):
        if w in _FORBIDDEN_WORDS:
            raise ReadOnlySQLError(f"{w} is not allowed in read-only SQL")
        if w == "FORMAT" and (k + 1 >= len(words) or words[k + 1] != "("):
            raise ReadOnlySQLError("a FORMAT clause is not allowed (results use the client's format)")
    return sql[: tokens[-1][1]]
