"""Guard for user-supplied SQL: one read of Eroica's own tables, nothing else.

``eroica sql`` and the sink's ``POST /sql`` accept *only* reads of the tables in
Eroica's database (``verdicts`` and ``summaries``, ``schema.py``). Everything
is decided by allow-lists, on both engines:

- statements: ``SELECT``/``WITH ... SELECT``; ``DESCRIBE``/``DESC`` and
  ``EXISTS`` of a table of Eroica's database; ``SHOW TABLES [FROM db]
  [LIKE '...']`` and ``SHOW CREATE [TABLE] t`` on Eroica's database only;
- tables: names in Eroica's database (unqualified names resolve there: the
  read connection's current database is Eroica's) or the query's own ``WITH``
  subqueries. Another database (``system``, ``default``,
  ``information_schema``...) is refused wherever its name appears;
- functions: :data:`ALLOWED_FUNCTIONS` (pure computations and aggregates),
  with aggregate combinators (``countIf``, ``sumArray``...). Everything else
  is refused: table functions (``file``, ``url``, ``s3``, ``remote``,
  ``numbers``...), functions that reach out or look outside the tables
  (``url``, ``dictGet``, ``joinGet``, ``hasColumnInTable``, ``hostName``,
  ``getSetting``, ``sleep``...);
- clauses: ``SETTINGS``, ``FORMAT``, ``INTO OUTFILE``, query parameters and
  more than one statement are refused (the client picks the result format).

Two layers read the text. :func:`check_readonly_sql` is a tokenizer (quotes,
comments, the shapes above, every ``name(`` against the allow-list, every
``a.b`` against the other databases' names); it is the only parser that works
on ClickHouse 18.16, which has no ``EXPLAIN``. Where the engine can parse for
us (chdb: ``EXPLAIN AST``, which parses without executing), its tree is
walked as well (:func:`check_ast`): table functions, table identifiers and
every function node against the *same* allow-lists. The tokenizer always runs
first: it alone refuses a second statement, which chdb's ``EXPLAIN AST a; b``
would execute. Anything the tokenizer cannot read plainly (an unterminated
quote or comment, a non-ASCII character, ``$``/``#``/``{`` outside literals,
a quoted identifier that is not a plain word) is refused rather than guessed.

The engine backs both: reads run with ``readonly=1`` (18.16 refuses table
functions under it; chdb does not for ``DESCRIBE``, hence the guard) and with
per-query time, memory and result limits set by the server side
(:class:`ReadLimits`, ``client.py``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "ReadOnlySQLError", "SQLPolicy", "check_readonly_sql", "check_ast", "function_allowed",
    "READ_STATEMENTS", "ALLOWED_FUNCTIONS", "SYSTEM_DATABASES",
]

READ_STATEMENTS = frozenset({"SELECT", "SHOW", "DESCRIBE", "DESC", "EXISTS", "WITH"})

# Databases refused even when the engine has not told us its list (both engines have these).
SYSTEM_DATABASES = frozenset({"system", "default", "information_schema", "_temporary_and_external_tables"})

# Words refused anywhere outside literals: they change where or how results go, or the settings.
_FORBIDDEN_WORDS = {
    "SETTINGS": "a SETTINGS clause is not allowed (limits are set by the server side)",
    "FORMAT": "a FORMAT clause is not allowed (results use the client's format)",
    "INTO": "INTO (OUTFILE) is not allowed in read-only SQL",
    "OUTFILE": "INTO OUTFILE is not allowed in read-only SQL",
    "INFILE": "FROM INFILE is not allowed in read-only SQL",
    "APPLY": "column transformers with APPLY are not allowed",
}

# Keywords that may stand right before "(" without being a function call.
_PAREN_KEYWORDS = frozenset({
    "SELECT", "FROM", "WHERE", "PREWHERE", "HAVING", "QUALIFY", "BY", "ON", "USING", "AS", "IN", "NOT", "AND",
    "OR", "JOIN", "EXISTS", "WITH", "UNION", "ALL", "DISTINCT", "EXCEPT", "INTERSECT", "THEN", "ELSE", "WHEN",
    "CASE", "LIKE", "ILIKE", "BETWEEN", "IS", "LIMIT", "OFFSET", "OVER", "INTERVAL", "ARRAY", "REPLACE",
    "COLUMNS", "GLOBAL", "ASC", "DESC", "WINDOW", "ROWS", "RANGE", "PRECEDING", "FOLLOWING", "TO",
    "FILL", "STEP", "PARTITION", "END", "TOTALS", "TIES",
    # type constructors inside CAST(x AS T(...)) / x::T(...)
    "NULLABLE", "LOWCARDINALITY", "DECIMAL", "DECIMAL32", "DECIMAL64", "DECIMAL128", "DECIMAL256",
    "DATETIME", "DATETIME64", "FIXEDSTRING", "TUPLE", "MAP", "ENUM8", "ENUM16", "NESTED",
})

# Pure functions and aggregates (lower-cased; ClickHouse resolves some names case-insensitively,
# and a name the engine does not know fails there, so lower-casing only ever widens to unknowns).
# Operators appear under their function names in the engine's AST (equals, plus, and...).
ALLOWED_FUNCTIONS = frozenset(n.lower() for n in """
equals notEquals less greater lessOrEquals greaterOrEquals plus minus multiply divide modulo moduloOrZero
intDiv intDivOrZero negate abs and or not xor in notIn globalIn globalNotIn nullIn notNullIn
like notLike ilike notILike match tuple tupleElement array arrayElement lambda CAST accurateCast
accurateCastOrNull if multiIf ifNull nullIf coalesce assumeNotNull isNull isNotNull
count sum avg min max any anyLast anyHeavy argMin argMax uniq uniqExact uniqCombined uniqCombined64
uniqHLL12 uniqTheta median medianExact quantile quantiles quantileExact quantilesExact quantileTiming
quantilesTiming quantileTDigest quantilesTDigest quantileDeterministic quantileExactWeighted
quantileExactLow quantileExactHigh quantileInterpolatedWeighted quantileBFloat16
stddevPop stddevSamp varPop varSamp covarPop covarSamp corr skewPop skewSamp kurtPop kurtSamp
groupArray groupUniqArray groupArraySample groupArrayMovingSum groupArrayMovingAvg groupBitAnd groupBitOr
groupBitXor groupArrayInsertAt topK topKWeighted sumMap minMap maxMap sumWithOverflow sumKahan avgWeighted
entropy simpleLinearRegression histogram last_value first_value
row_number rank dense_rank percent_rank cume_dist ntile lagInFrame leadInFrame nth_value
runningDifference runningDifferenceStartingWithFirstValue rowNumberInBlock rowNumberInAllBlocks
round roundBankers floor ceil ceiling trunc truncate roundToExp2 roundDuration roundAge exp exp2 exp10 log ln
log2 log10 log1p sqrt cbrt pow power sin cos tan asin acos atan atan2 sinh cosh tanh hypot sign e pi
greatest least isFinite isInfinite isNaN ifNotFinite erf erfc lgamma tgamma gcd lcm max2 min2
bitAnd bitOr bitXor bitNot bitShiftLeft bitShiftRight bitCount bitTest
length empty notEmpty lower upper lowerUTF8 upperUTF8 lengthUTF8 reverse reverseUTF8 concat concatWithSeparator
substring substr substringUTF8 mid left right leftUTF8 rightUTF8 trim trimLeft trimRight trimBoth ltrim rtrim
leftPad rightPad lpad rpad repeat space position positionCaseInsensitive positionUTF8 locate
startsWith endsWith replaceOne replaceAll replace replaceRegexpOne replaceRegexpAll regexpQuoteMeta
extract extractAll extractAllGroups extractGroups splitByChar splitByString splitByRegexp splitByWhitespace
splitByNonAlpha arrayStringConcat countSubstrings countMatches multiSearchAny multiSearchFirstIndex
multiSearchAllPositions multiMatchAny hasToken hasTokenCaseInsensitive base64Encode base64Decode
tryBase64Decode hex unhex bin unbin leftUTF8 normalizeUTF8NFC toValidUTF8 format_bytes formatReadableSize
formatReadableQuantity formatReadableTimeDelta formatDateTime formatDateTimeInJodaSyntax parseDateTimeBestEffort
parseDateTimeBestEffortOrNull parseDateTimeBestEffortOrZero parseDateTime64BestEffort
now now64 today yesterday timeSlot timeSlots dateDiff date_diff age date_trunc dateTrunc dateName
fromUnixTimestamp fromUnixTimestamp64Milli fromUnixTimestamp64Micro fromUnixTimestamp64Nano
addYears addQuarters addMonths addWeeks addDays addHours addMinutes addSeconds addMilliseconds
addMicroseconds addNanoseconds subtractYears subtractQuarters subtractMonths subtractWeeks subtractDays
subtractHours subtractMinutes subtractSeconds subtractMilliseconds subtractMicroseconds subtractNanoseconds
timeZone timezone timeZoneOf timeZoneOffset
has hasAll hasAny hasSubstr indexOf countEqual range arrayJoin replicate emptyArrayInt32 emptyArrayString
emptyArrayUInt64 emptyArrayFloat64 arrayEnumerate arrayEnumerateUniq arrayPopBack arrayPopFront arrayPushBack
arrayPushFront arrayResize arraySlice arraySort arrayReverseSort arrayReverse arrayUniq arrayDistinct
arrayMap arrayFilter arrayExists arrayAll arrayCount arraySum arrayAvg arrayMin arrayMax arrayProduct
arrayFirst arrayLast arrayFirstIndex arrayLastIndex arrayCumSum arrayDifference arrayZip arrayFlatten
arrayCompact arrayConcat arrayIntersect arrayReduce arrayElementOrNull arrayShuffle arrayPartialSort
arrayStringConcat arrayFill arrayReverseFill arraySplit arrayReverseSplit arrayAUC arrayProduct
JSONHas JSONLength JSONType JSONExtract JSONExtractInt JSONExtractUInt JSONExtractFloat JSONExtractBool
JSONExtractString JSONExtractRaw JSONExtractArrayRaw JSONExtractKeys JSONExtractKeysAndValues
JSONExtractKeysAndValuesRaw visitParamHas visitParamExtractUInt visitParamExtractInt visitParamExtractFloat
visitParamExtractBool visitParamExtractRaw visitParamExtractString simpleJSONHas simpleJSONExtractUInt
simpleJSONExtractInt simpleJSONExtractFloat simpleJSONExtractBool simpleJSONExtractRaw simpleJSONExtractString
toJSONString cityHash64 sipHash64 sipHash128 farmHash64 xxHash32 xxHash64 murmurHash2_64 murmurHash3_64
intHash32 intHash64 halfMD5 MD5 SHA1 SHA256 crc32 rand rand32 rand64 randConstant generateUUIDv4
transform materialize identity ignore toTypeName blockSize isConstant bar
""".split())

# Aggregate-function combinators that may follow an allowed aggregate (countIf, sumArrayIf, uniqState...).
_COMBINATORS = ("if", "array", "distinct", "ornull", "ordefault", "foreach", "state", "merge", "mergestate",
                "resample", "map", "simplestate", "argmin", "argmax")
# Conversion families whose every member is pure: toString, toUInt64, toStartOfHour, toYYYYMM,
# toIntervalDay, isNaN, isValidUTF8...
_PURE_PREFIXES = ("to", "is")
# Never, whatever a prefix says.
_DENIED = frozenset(n.lower() for n in """
url file s3 s3Cluster gcs hdfs hdfsCluster remote remoteSecure cluster clusterAllReplicas input executable
jdbc odbc mysql postgresql sqlite mongodb redis merge numbers numbers_mt zeros zeros_mt generateRandom
values view viewIfPermitted null format dictionary dictGet joinGet hasColumnInTable getSetting sleep
sleepEachRow hostName fqdn tcpPort getMacro globalVariable trap addressToLine addressToSymbol demangle
getServerPort uptime filesystemAvailable filesystemCapacity filesystemFree filesystemUnreserved
getClientHTTPHeader currentProfiles currentRoles enabledProfiles defaultProfiles serverUUID
isDecimalOverflow toRemoteDatetime initialQueryID queryID currentQueryID
""".split())


class ReadOnlySQLError(ValueError):
    """The SQL is not a single read of Eroica's tables."""


@dataclass(frozen=True)
class SQLPolicy:
    """What a user read may name: Eroica's database, and the databases it may not."""

    database: str = "eroica"
    # Names of every other database the engine has (asked at check time) plus SYSTEM_DATABASES.
    foreign_databases: frozenset[str] = SYSTEM_DATABASES

    @classmethod
    def for_database(cls, database: str, known_databases: Iterable[str] = ()) -> SQLPolicy:
        foreign = {d.lower() for d in (*SYSTEM_DATABASES, *known_databases)} - {database.lower()}
        return cls(database, frozenset(foreign))

    def check_database(self, name: str) -> None:
        if name != self.database:
            raise ReadOnlySQLError(f"only Eroica's database {self.database!r} may be read; got {name!r}")

    def check_chain_head(self, head: str) -> None:
        """``head`` starts a dotted name (``head.x``): refuse it when it names another database."""
        if head.lower() in self.foreign_databases and head != self.database:
            raise ReadOnlySQLError(f"database {head!r} is not Eroica's; only {self.database!r} may be read")


def function_allowed(name: str) -> bool:
    """True when ``name`` is a pure function of the allow-list (or an allowed aggregate + combinators)."""
    low = name.lower()
    if low in _DENIED or low.startswith(("dict", "joinget", "remote", "cluster", "file", "url", "s3", "hdfs")):
        return False
    if low in ALLOWED_FUNCTIONS:
        return True
    if low.startswith(_PURE_PREFIXES) and len(low) > 2 and name[2:3].isupper() and name.isascii():
        return True
    base = low
    for _ in range(4):  # countIfArray, sumArrayIf, uniqStateIf ...
        for comb in _COMBINATORS:
            if base.endswith(comb) and len(base) > len(comb):
                base = base[: -len(comb)]
                if base in ALLOWED_FUNCTIONS:
                    return True
                break
        else:
            return False
    return False


def _refuse_function(name: str) -> ReadOnlySQLError:
    return ReadOnlySQLError(f"function {name!r} is not allowed in read-only SQL (only pure functions and "
                            "aggregates; no table functions, dictionaries or functions that reach out)")


# -- tokenizer ---------------------------------------------------------------------------
_PLAIN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PUNCT_OK = set("()[],.+-*/%=<>!|:?")


@dataclass(frozen=True)
class _Tok:
    kind: str  # "word" (bare; also numbers), "ident" (quoted identifier), "string", "punct"
    text: str  # a bare word as written, a quoted identifier unquoted, a punctuation character
    end: int   # offset just past the token in the SQL text

    @property
    def up(self) -> str:
        return self.text.upper() if self.kind == "word" else ""

    @property
    def is_name(self) -> bool:
        return self.kind == "ident" or (self.kind == "word" and not self.text[0].isdigit())


def _tokens(sql: str) -> list[_Tok]:
    """Tokens of ``sql`` outside comments; ReadOnlySQLError on anything not read plainly."""
    toks: list[_Tok] = []
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
            body = sql[i + 1 : j]
            if c == "'":
                toks.append(_Tok("string", body, j + 1))
            else:
                if not _PLAIN.match(body):
                    raise ReadOnlySQLError(f"quoted identifier {sql[i:j + 1]!r}: only plain names "
                                           "(letters, digits, _) may be quoted")
                toks.append(_Tok("ident", body, j + 1))
            i = j + 1
        elif sql.startswith("--", i):
            j = sql.find("\n", i)
            end = n if j < 0 else j
            _check_comment(sql[i:end])
            i = end
        elif sql.startswith("/*", i):
            j = sql.find("*/", i + 2)
            if j < 0:
                raise ReadOnlySQLError("unterminated /* comment")
            _check_comment(sql[i : j + 2])
            i = j + 2
        elif c.isascii() and (c.isalnum() or c == "_"):
            j = i
            while j < n and sql[j].isascii() and (sql[j].isalnum() or sql[j] == "_"):
                j += 1
            toks.append(_Tok("word", sql[i:j], j))
            i = j
        elif c in " \t\n" or (c == "\r" and sql.startswith("\r\n", i)):
            i += 1
        elif c in _PUNCT_OK or c == ";":
            toks.append(_Tok("punct", c, i + 1))
            i += 1
        else:
            raise ReadOnlySQLError(f"character {c!r} at offset {i} is not allowed outside literals "
                                   "(no query parameters, heredocs, # comments or non-ASCII names)")
    return toks


def _check_comment(text: str) -> None:
    # A comment must end where every engine ends it: no other line breaks or control characters.
    if any((ord(ch) < 32 and ch not in "\t\n") or ch == "\x7f" for ch in text.replace("\r\n", "\n")):
        raise ReadOnlySQLError("control characters inside a comment are not allowed")


def _table_name(toks: list[_Tok], k: int, policy: SQLPolicy) -> int:
    """Check a ``[db.]table`` at ``toks[k]``; return the index after it."""
    if k >= len(toks) or not toks[k].is_name:
        raise ReadOnlySQLError("expected a table name of Eroica's database")
    if k + 2 < len(toks) and toks[k + 1].text == "." and toks[k + 1].kind == "punct":
        if not toks[k + 2].is_name:
            raise ReadOnlySQLError("expected a table name after the database")
        policy.check_database(toks[k].text)
        return k + 3
    return k + 1


def _check_show(toks: list[_Tok], policy: SQLPolicy) -> None:
    ups = [t.up for t in toks]
    if ups[1:2] == ["TABLES"]:
        k = 2
        if k < len(toks) and ups[k] in ("FROM", "IN"):
            if k + 1 >= len(toks) or not toks[k + 1].is_name:
                raise ReadOnlySQLError("SHOW TABLES FROM needs Eroica's database name")
            policy.check_database(toks[k + 1].text)
            k += 2
        if k < len(toks) and ups[k] in ("LIKE", "ILIKE") and k + 1 < len(toks) and toks[k + 1].kind == "string":
            k += 2
        if k != len(toks):
            raise ReadOnlySQLError("only SHOW TABLES [FROM db] [LIKE '...'] is allowed")
        return
    if ups[1:2] == ["CREATE"]:
        k = 3 if ups[2:3] == ["TABLE"] else 2
        if _table_name(toks, k, policy) != len(toks):
            raise ReadOnlySQLError("only SHOW CREATE TABLE <table of Eroica's database> is allowed")
        return
    raise ReadOnlySQLError("only SHOW TABLES and SHOW CREATE TABLE on Eroica's database are allowed")


def _check_select(toks: list[_Tok], policy: SQLPolicy) -> None:
    for k, t in enumerate(toks):
        if t.kind == "word":
            msg = _FORBIDDEN_WORDS.get(t.up)
            if msg:
                raise ReadOnlySQLError(msg)
        nxt = toks[k + 1] if k + 1 < len(toks) else None
        if t.is_name and nxt is not None and nxt.kind == "punct" and nxt.text == "(":
            if not (t.kind == "word" and t.up in _PAREN_KEYWORDS) and not function_allowed(t.text):
                raise _refuse_function(t.text)
        if t.up in ("FROM", "JOIN") and k + 2 < len(toks) and toks[k + 1].is_name and toks[k + 2].text == ".":
            policy.check_database(toks[k + 1].text)  # FROM db.table: Eroica's database only
        prev = toks[k - 1] if k else None
        if (t.is_name and nxt is not None and nxt.kind == "punct" and nxt.text == "."
                and not (prev is not None and prev.kind == "punct" and prev.text == ".")):
            policy.check_chain_head(t.text)


def check_readonly_sql(sql: str, policy: SQLPolicy | None = None) -> str:
    """Return the one read statement in ``sql`` (trailing ``;`` and comments cut off), or raise.

    The tokenizer layer (the whole guard on 18.16; the first layer on chdb).
    ``policy`` names Eroica's database and the others (default: ``eroica``
    against the system databases).
    """
    policy = policy or SQLPolicy()
    if not isinstance(sql, str) or not sql.strip():
        raise ReadOnlySQLError("empty SQL")
    toks = _tokens(sql)
    while toks and toks[-1].kind == "punct" and toks[-1].text == ";":
        toks.pop()
    if not toks:
        raise ReadOnlySQLError("no statement (only comments)")
    if any(t.kind == "punct" and t.text == ";" for t in toks):
        raise ReadOnlySQLError("only one statement is allowed")
    first = toks[0].up
    if first not in READ_STATEMENTS:
        raise ReadOnlySQLError(
            f"only read statements are allowed ({', '.join(sorted(READ_STATEMENTS))}); got {toks[0].text!r}"
        )
    if first == "SHOW":
        _check_show(toks, policy)
    elif first in ("DESCRIBE", "DESC", "EXISTS"):
        k = 2 if toks[1:2] and toks[1].up == "TABLE" else 1
        if k < len(toks) and toks[k].kind == "punct":
            raise ReadOnlySQLError(f"{first} takes a table of Eroica's database only "
                                   "(no table functions or subqueries)")
        end = _table_name(toks, k, policy)
        if end < len(toks) and toks[end].text == "(":
            raise ReadOnlySQLError(f"{first} of a table function ({toks[k].text!r}) is not allowed: "
                                   "only Eroica's tables")
        if end != len(toks):
            raise ReadOnlySQLError(f"{first} [TABLE] <table of Eroica's database> takes nothing more")
    else:
        _check_select(toks, policy)
    return sql[: toks[-1].end]


# -- the engine's own parse tree (chdb: EXPLAIN AST) --------------------------------------
_AST_NODES = frozenset({
    "SelectWithUnionQuery", "SelectIntersectExceptQuery", "SelectQuery", "ExpressionList", "TablesInSelectQuery",
    "TablesInSelectQueryElement", "TableExpression", "TableIdentifier", "TableJoin", "ArrayJoin", "Subquery",
    "Identifier", "Literal", "Function", "Asterisk", "QualifiedAsterisk", "ColumnsRegexpMatcher",
    "ColumnsListMatcher", "QualifiedColumnsRegexpMatcher", "QualifiedColumnsListMatcher",
    "ColumnsTransformerList", "ColumnsExceptTransformer", "ColumnsReplaceTransformer", "OrderByElement",
    "WithElement", "WindowDefinition", "WindowListElement", "SampleRatio", "Interval", "InterpolateElement",
    "DescribeQuery", "ShowTables", "ShowCreateTableQuery", "ExistsTableQuery", "Alias",
})
_LINE = re.compile(r"^( *)(\S+)(?: (.*?))?(?: \(children \d+\))?$")


@dataclass
class _Node:
    kind: str
    arg: str
    children: list[_Node]


def _parse_ast(text: str) -> _Node:
    root: _Node | None = None
    stack: list[tuple[int, _Node]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        m = _LINE.match(line)
        if m is None:
            raise ReadOnlySQLError(f"unreadable parse tree line {line!r}")
        depth, node = len(m.group(1)), _Node(m.group(2), (m.group(3) or "").strip(), [])
        while stack and stack[-1][0] >= depth:
            stack.pop()
        if stack:
            if depth != stack[-1][0] + 1:
                raise ReadOnlySQLError("unreadable parse tree (indentation)")
            stack[-1][1].children.append(node)
        elif root is None:
            root = node
        else:
            raise ReadOnlySQLError("the parse tree holds more than one statement")
        stack.append((depth, node))
    if root is None:
        raise ReadOnlySQLError("empty parse tree")
    return root


def _first_word(arg: str) -> str:
    return arg.split(" (alias ", 1)[0].split(" ", 1)[0] if arg else ""


def check_ast(ast_text: str, policy: SQLPolicy | None = None) -> None:
    """Walk the engine's ``EXPLAIN AST`` of an already tokenizer-checked statement; raise if refused."""
    policy = policy or SQLPolicy()
    root = _parse_ast(ast_text)
    if root.kind not in ("SelectWithUnionQuery", "DescribeQuery", "ShowTables", "ShowCreateTableQuery",
                         "ExistsTableQuery"):
        raise ReadOnlySQLError(f"statement {root.kind} is not a read of Eroica's tables")
    if root.kind == "DescribeQuery":
        te = root.children
        if len(te) != 1 or te[0].kind != "TableExpression" or [c.kind for c in te[0].children] != ["TableIdentifier"]:
            raise ReadOnlySQLError("DESCRIBE takes a table of Eroica's database only (no table functions or "
                                   "subqueries)")
    if root.kind in ("ShowTables", "ShowCreateTableQuery", "ExistsTableQuery"):
        idents = [c for c in root.children if c.kind == "Identifier"]
        if len(idents) != len(root.children):
            raise ReadOnlySQLError(f"{root.kind}: unexpected clause")
        if root.kind == "ShowTables" and idents:
            policy.check_database(_first_word(idents[0].arg))
        elif len(idents) == 2:
            policy.check_database(_first_word(idents[0].arg))
        return
    _walk(root, None, policy)


def _walk(node: _Node, parent: _Node | None, policy: SQLPolicy) -> None:
    kind = node.kind
    if kind == "Set":
        raise ReadOnlySQLError(_FORBIDDEN_WORDS["SETTINGS"])
    if kind not in _AST_NODES:
        raise ReadOnlySQLError(f"{kind} is not allowed in read-only SQL")
    name = _first_word(node.arg)
    if kind == "SelectWithUnionQuery" and [c.kind for c in node.children] != ["ExpressionList"]:
        raise ReadOnlySQLError("FORMAT and INTO OUTFILE clauses are not allowed")
    if kind == "Function":
        if parent is not None and parent.kind == "TableExpression":
            raise ReadOnlySQLError(f"table function {name!r} is not allowed: only Eroica's tables may be read")
        if not function_allowed(name):
            raise _refuse_function(name)
    if kind == "TableIdentifier" and "." in name:
        policy.check_database(name.split(".", 1)[0])
    if kind in ("Identifier", "QualifiedAsterisk") and "." in name:
        policy.check_chain_head(name.split(".", 1)[0])
    for child in node.children:
        _walk(child, node, policy)
