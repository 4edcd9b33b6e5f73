"""The kernels' argument formats, read from their declarations in the .cu files: each kernel's
signature is written once, where the kernel is, and a launcher names a kernel and passes its
arguments, nothing else.

An entry point is an ``extern "C" __global__ void NAME(type a, ...)`` of a kernel file or of
a header it includes (by quotes), written out or made by a function-like macro: an
invocation of a macro at the start of a line (outside #define lines) is expanded, and the
invocations in its expansion in turn (X-macros such as gemm_tc.cuh's TC_TILES), with
``##`` pasting, so the names and parameter lists come out as the compiler sees them. #if
branches are not evaluated: every branch's entries are read (a kernel file declares its
entries outside them).

A parameter's kind is its struct code, as PyCUDA's prepare takes them: P a pointer (any
``T*``), i int, I unsigned int, q long long, f float; T a 128-byte CUtensorMap passed by
value (__grid_constant__; gemm_wgmma.cu's, launched by ops/convolution/wgmma.py through the
driver API, never by PyCUDA). Reading needs no PyCUDA: the CPU tests check every launch
against these formats.
"""

import functools
import os
import re

from . import kernel_cache, prebuilt


class SignatureError(ValueError):
    """A kernel declaration this module cannot read (an unknown parameter type, an entry
    point declared twice in one file)."""


_TYPE_KINDS = {
    "int": "i",
    "unsigned int": "I",
    "unsigned": "I",
    "long long": "q",
    "float": "f",
    "TensorMap": "T",
    "CUtensorMap": "T",
}
_QUALIFIERS = re.compile(r"\b(const|__restrict__|__grid_constant__|volatile)\b")
_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", flags=re.S)
# void, then attributes such as __launch_bounds__(32 * WM * WN, 512 / (32 * WM * WN)) (one
# level of parentheses inside), the name and the parameter list (none inside).
_ENTRY = re.compile(
    r'extern\s+"C"\s+__global__\s+void\s+'
    r"((?:__\w+__\s*\((?:[^()]|\([^()]*\))*\)\s*)*)(\w+)\s*\(([^()]*)\)"
)
_DEFINE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(\w+)(\(([^)]*)\))?[ \t]*(.*)$", flags=re.M)
_DIRECTIVE = re.compile(r"^[ \t]*#.*$", flags=re.M)
_MAX_DEPTH = 8


def _code(text):
    """text without comments, its continued lines joined."""
    return _COMMENTS.sub(" ", text).replace("\\\n", " ")


def _function_macros(text):
    """{name: (parameters, body)} of the function-like macros #defined in text (the last
    definition of a name wins, as for the one #if branch the compiler takes: the bodies of
    entry macros are the same in every branch)."""
    return {
        name: ([p.strip() for p in params.split(",") if p.strip()], body)
        for name, has_params, params, body in _DEFINE.findall(text)
        if has_params
    }


def _arguments(text, start):
    """(arguments, end) of a macro invocation whose '(' is at text[start]: the text between
    top-level commas, and the index after the matching ')'."""
    depth, args, piece = 0, [], start + 1
    for i in range(start, len(text)):
        c = text[i]
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                args.append(text[piece:i].strip())
                return args, i + 1
        elif c == "," and depth == 1:
            args.append(text[piece:i].strip())
            piece = i + 1
    raise SignatureError(f"unbalanced parentheses in a macro invocation: {text[start:][:80]!r}")


_PASTE = re.compile(r"\s*##\s*")


@functools.lru_cache(maxsize=None)
def _parameter_pattern(params):
    return re.compile(r"\b(" + "|".join(map(re.escape, params)) + r")\b")


def _expand(macros, name, args):
    """The body of macro `name` with its parameters replaced by args, ## pasted."""
    params, body = macros[name]
    if len(params) != len(args):
        raise SignatureError(f"macro {name} takes {len(params)} arguments, given {len(args)}")
    if params:
        values = dict(zip(params, args))
        body = _parameter_pattern(tuple(params)).sub(lambda m: values[m.group(1)], body)
    return _PASTE.sub("", body)


def _invocations(macros):
    """(at line starts, anywhere): patterns of an invocation of one of `macros`."""
    return _invocation_patterns(tuple(sorted(macros)))


@functools.lru_cache(maxsize=64)
def _invocation_patterns(macro_names):
    names = "|".join(map(re.escape, macro_names))
    return (
        re.compile(rf"^[ \t]*\b({names})[ \t]*(?=\()", flags=re.M),
        re.compile(rf"\b({names})[ \t]*(?=\()"),
    )


def _entries_in(text, macros, invocations, anywhere, depth, found):
    """Add text's entry points to found ({name: format}); expand the macro invocations at
    line starts (anywhere: at any place, in a macro's expansion) and read theirs."""
    for _, name, params in _ENTRY.findall(text):
        _add(found, name, _format(name, params))
    if depth >= _MAX_DEPTH or not macros:
        return
    for m in invocations[anywhere].finditer(text):
        args, _ = _arguments(text, m.end())
        expanded = _expand(macros, m.group(1), args)
        _entries_in(expanded, macros, invocations, True, depth + 1, found)


def _add(found, name, fmt):
    if name in found and found[name] != fmt:
        raise SignatureError(f"kernel {name} declared twice, taking '{found[name]}' and '{fmt}'")
    found[name] = fmt


def _format(name, params):
    """The struct format of a C parameter list."""
    fmt, unknown = _parameters_format(" ".join(params.split()))
    if unknown is not None:
        raise SignatureError(
            f"kernel {name} takes a parameter of type '{unknown}', which has no "
            f"argument kind (known: pointers, {', '.join(_TYPE_KINDS)})"
        )
    return fmt


@functools.lru_cache(maxsize=None)
def _parameters_format(params):
    """(struct format, None) of a parameter list; (None, type) at a type of no kind."""
    fmt = ""
    for param in params.split(","):
        param = " ".join(_QUALIFIERS.sub(" ", param).split())
        if not param or param == "void":
            continue
        if "*" in param:
            fmt += "P"
            continue
        ctype = " ".join(param.split()[:-1])  # the last word is the parameter's name
        if ctype not in _TYPE_KINDS:
            return None, ctype
        fmt += _TYPE_KINDS[ctype]
    return fmt, None


def file_signatures(source, filename="kernel", include_dirs=()):
    """{entry point: struct format} of kernel source text `source` (filename names it in
    errors), its quoted #includes found in include_dirs."""
    chunks = [text for _, text in kernel_cache.included_headers(source, include_dirs)]
    prepared = [_prepared(text) for text in chunks + [source]]
    macros = {}
    for _, defined in prepared:
        macros.update(defined)
    key = tuple(sorted((name, tuple(params), body) for name, (params, body) in macros.items()))
    found = {}
    try:
        for code, _ in prepared:
            for name, fmt in _chunk_entries(code, key).items():
                _add(found, name, fmt)
    except SignatureError as e:
        raise SignatureError(f"{filename}: {e}") from None
    return found


@functools.lru_cache(maxsize=256)
def _prepared(text):
    """(text without comments and directives, its function-like macros): a header's is
    read once however many files include it."""
    code = _code(text)
    return _DIRECTIVE.sub("", code), _function_macros(code)


@functools.lru_cache(maxsize=256)
def _chunk_entries(code, macro_key):
    """The entry points of one file's or header's code, given every macro the file sees
    (read once for the files that include one header and see the same macros)."""
    macros = {name: (list(params), body) for name, params, body in macro_key}
    found = {}
    _entries_in(code, macros, _invocations(macros), False, 0, found)
    return found


@functools.lru_cache(maxsize=None)
def _cached(path, mtime, include_dirs):
    with open(path) as f:
        return file_signatures(f.read(), os.path.basename(path), include_dirs)


def signatures(filename, kernel_dirs=None):
    """{entry point: struct format} of kernel file `filename` (found by name in the op
    families' folders, prebuilt.kernel_paths), read once per process while it is
    unchanged."""
    dirs = tuple(prebuilt.KERNEL_DIRS if kernel_dirs is None else kernel_dirs)
    path = _kernel_paths(dirs)[filename]
    return dict(_cached(path, os.path.getmtime(path), dirs))


@functools.lru_cache(maxsize=16)
def _kernel_paths(dirs):
    return prebuilt.kernel_paths(dirs)


def kernel_table(filenames, kernel_dirs=None):
    """{kernel file: {entry point: struct format}} of the named kernel files; an entry point
    declared in two of them raises SignatureError (a launch names a kernel alone)."""
    table, where = {}, {}
    for filename in sorted(set(filenames)):
        entries = signatures(filename, kernel_dirs)
        for name in entries:
            if name in where:
                raise SignatureError(
                    f"kernel {name} is declared in both {where[name]} and {filename}"
                )
            where[name] = filename
        table[filename] = entries
    return table


def pycuda_format(name, fmt):
    """fmt for PyCUDA's prepare: its struct codes as they are; a tensor map (T) is refused,
    PyCUDA's packed launch cannot pass one (wgmma.py launches those kernels)."""
    if "T" in fmt:
        raise SignatureError(f"kernel {name} takes a tensor map: launch it through the driver API")
    return fmt
