"""Every kernel launch against the kernel's declaration, read as text (no PyCUDA, no GPU).

A kernel's argument format is read from its .cu declaration (backends/kernel_signatures.py);
a launcher names the kernel and passes its arguments. These tests find every launch in the
CUDA backend's modules (backends/cuda_*.py, ops/*/*.py): `X._launch(name, grid, block,
*args)` and `X._launch_rows(name, rows, width, *args)` (PyCUDA), and ops/convolution/wgmma.py's
`_launch(be, kern, name, grid, block, *args)` (the driver API through ctypes), and check
that the argument count and each argument's kind (pointer, integer, float, tensor map) agree
with every kernel the name can be.

An argument's kind is read from its expression: self._ptr(a) / a.ptr / ctypes.c_uint64 a
pointer (0: a null pointer, or an integer), int() / len() / np.int32 / ctypes.c_int an
integer, float() / np.float32 / ctypes.c_float and float literals a float, a name from what
the function assigns to it (a private helper's parameter: from what the module's calls of
it pass, each call followed on its own; a backend op's parameter or an object's field: a
number from the layers, which pass arrays to kernels only through self._ptr), a starred
tuple from the tuple it names. A number of unknown kind is checked for not being a pointer
only. A launch whose arguments cannot be read so fails, naming the argument: write it so
that its kind shows.
"""

import ast
import contextlib
import re
from pathlib import Path

import pytest

from darknet_py.backends import kernel_signatures, prebuilt

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "darknet_py"
WGMMA_PY = PACKAGE / "ops" / "convolution" / "wgmma.py"
WGMMA_FILES = ("gemm_wgmma.cu", "gemm_wgmma_solo.cu")
# The channels-last forward's launcher: wgmma.py's ctypes launch, conv_nhwc.cu's kernels.
NHWC_PY = PACKAGE / "ops" / "convolution" / "nhwc.py"
NHWC_FILE = "conv_nhwc.cu"

POINTER, ZERO, INT, FLOAT, NUMBER, TENSOR_MAP, UNKNOWN = "P", "0", "i", "f", "n", "T", "?"
_ACCEPTS = {  # a parameter's struct code -> the argument kinds it takes
    "P": {POINTER, ZERO},
    "i": {INT, ZERO, NUMBER},
    "I": {INT, ZERO, NUMBER},
    "q": {INT, ZERO, NUMBER},
    "f": {FLOAT, NUMBER, ZERO},
    "T": {TENSOR_MAP},
}
_INT_CALLS = {"int", "len", "round", "ord", "bool"}
_INT_CALLS |= {f"np.{t}" for t in ("int32", "int64", "uint32", "intc", "uint64")}
_INT_CALLS |= {f"ctypes.c_{t}" for t in ("int", "int32", "int64", "uint32", "longlong", "uint")}
_FLOAT_CALLS = {"float", "np.float32", "np.float64", "ctypes.c_float"}
_POINTER_CALLS = {"ctypes.c_uint64", "ctypes.c_void_p"}
# imported helpers that return an int or a tuple of ints (cuda_core's, wgmma's, shapes')
_INT_HELPERS = {"_ceil_div", "row_pitch", "conv_out_size", "conv_strides"}


def launcher_modules():
    """{path: ast} of the modules that launch kernels."""
    backends = PACKAGE / "backends"
    paths = [*backends.glob("cuda_*.py"), *(PACKAGE / "ops").glob("*/*.py")]
    return {path: ast.parse(path.read_text()) for path in sorted(paths)}


def _literal_env(tree):
    env = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            try:
                env[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    return env


def family_kernel_files(modules):
    """Every family's KERNEL_FILES (evaluated over its module's literal constants)."""
    files = []
    for path, tree in modules.items():
        for node in tree.body:
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == "KERNEL_FILES"
            ):
                env = {**_literal_env(tree), "__builtins__": {"tuple": tuple}}
                files += eval(compile(ast.Expression(node.value), str(path), "eval"), env)
    return files


class _Module:
    """One module's functions, for following names to what is assigned to them."""

    def __init__(self, tree):
        self.tree = tree
        self.parents = {}
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node
        self.functions = {}
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.Lambda)) and hasattr(node, "name"):
                self.functions.setdefault(node.name, []).append(node)
        self.imported = {
            alias.asname or alias.name
            for node in tree.body
            if isinstance(node, ast.ImportFrom)
            for alias in node.names
        }
        self.reader = None  # the Reader reading this module (for loops' elements)
        self.globals = {
            node.targets[0].id: node.value
            for node in tree.body
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
        }
        for node in tree.body:  # A, B, C = range(3): constants numbered
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.targets[0], ast.Tuple)
                and isinstance(node.value, ast.Call)
                and ast.unparse(node.value.func) == "range"
            ):
                for i, t in enumerate(node.targets[0].elts):
                    if isinstance(t, ast.Name):
                        self.globals[t.id] = ast.Constant(i)

    def function_of(self, node):
        while node is not None and not isinstance(node, ast.FunctionDef):
            node = self.parents.get(node)
        return node

    def assignments(self, function, name):
        """The expressions assigned to `name` in `function` (tuple unpacking followed where
        the value is a tuple of the same length); None if one cannot be followed."""
        found = []
        for node in ast.walk(function):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    value = _unpacked(target, node.value, name)
                    if value is _CANNOT:
                        return None
                    if value is not None:
                        found.append(value)
            elif isinstance(node, ast.AugAssign) and _is_name(node.target, name):
                found.append(node.value)
            elif (
                isinstance(node, (ast.For, ast.comprehension))
                and _is_name(node.target, name)
                and isinstance(node.iter, ast.Call)
                and ast.unparse(node.iter.func) == "range"
            ):
                found.append(_AN_INT)
            elif isinstance(node, ast.For) and _binds(node.target, name) and self.reader:
                tuples = self.reader.elements(node.iter)
                if tuples is None:
                    return None
                for t in tuples:
                    value = _from_element(node.target, t, name)
                    if value is None:
                        return None
                    found.append(value)
            elif isinstance(node, (ast.For, ast.comprehension)) and _binds(node.target, name):
                return None
        return found

    def callers(self, function):
        """The calls of `function` in this module (as self.f(...) or f(...))."""
        name = function.name
        return [
            node
            for node in ast.walk(self.tree)
            if isinstance(node, ast.Call)
            and (
                (isinstance(node.func, ast.Attribute) and node.func.attr == name)
                or (isinstance(node.func, ast.Name) and node.func.id == name)
            )
        ]


_CANNOT = object()
_DEPTH = 14  # names followed through at most this many assignments and calls
# What a parameter of a backend op holds (or of a helper no call in its module passes):
# a number from the layers. Their arrays reach a kernel only through self._ptr.
_AN_INT = ast.Call(func=ast.Name(id="int"), args=[], keywords=[])
_FROM_CALLER = ast.Call(func=ast.Name(id="_number_from_caller"), args=[], keywords=[])


def _from_element(target, parts, name):
    """What `for target in ...` binds to name from one element, the tuple `parts`: a part,
    or (a starred target) a tuple of parts."""
    if _is_name(target, name):
        return ast.Tuple(elts=list(parts), ctx=ast.Load())
    if not isinstance(target, ast.Tuple):
        return None
    stars = [i for i, t in enumerate(target.elts) if isinstance(t, ast.Starred)]
    after = len(target.elts) - 1 - stars[0] if stars else 0
    if (not stars and len(parts) != len(target.elts)) or len(parts) < len(target.elts) - 1:
        return None
    for i, t in enumerate(target.elts):
        if isinstance(t, ast.Tuple) and _binds(t, name) and (not stars or i < stars[0]):
            found = _unpacked(t, parts[i], name)  # for (a, b), c in ...
            return None if found is _CANNOT else found
        if isinstance(t, ast.Starred) and _is_name(t.value, name):
            return ast.Tuple(elts=list(parts[i : len(parts) - after]), ctx=ast.Load())
        if _is_name(t, name):
            before = not stars or i < stars[0]
            return parts[i] if before else parts[len(parts) - (len(target.elts) - i)]
    return None


def _is_name(node, name):
    return isinstance(node, ast.Name) and node.id == name


def _binds(target, name):
    return any(_is_name(n, name) for n in ast.walk(target))


def _unpacked(target, value, name):
    """The part of `value` that `target = value` assigns to name; None if it assigns none;
    _CANNOT if it assigns an unknown part."""
    if _is_name(target, name):
        return value
    if isinstance(target, (ast.Tuple, ast.List)) and _binds(target, name):
        if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts):
            for t, v in zip(target.elts, value.elts):
                part = _unpacked(t, v, name)
                if part is not None:
                    return part
        if isinstance(value, ast.IfExp):  # a, b = (x, y) if c else (z, w)
            both = [_unpacked(target, v, name) for v in (value.body, value.orelse)]
            if all(b is not None and b is not _CANNOT for b in both):
                return ast.IfExp(test=value.test, body=both[0], orelse=both[1])
        if isinstance(value, (ast.GeneratorExp, ast.ListComp)):  # a, b = (int(v) for v in ..)
            flat = all(isinstance(t, ast.Name) for t in target.elts)
            return value.elt if flat else _CANNOT
        if isinstance(value, (ast.Call, ast.Subscript, ast.Name)):  # the returned tuple's part
            for i, t in enumerate(target.elts):
                if _binds(t, name):
                    part = ast.Subscript(value=value, slice=ast.Constant(i), ctx=ast.Load())
                    return _unpacked(t, part, name)
        return _CANNOT
    return None


class _AnyParts(list):
    """The parts of a tuple an attribute holds, set elsewhere (a plan a benchmark or a test
    forces, self.gemm_override): each a number or a name part from outside."""

    def __len__(self):
        return 1 << 30

    def __getitem__(self, i):
        return _FROM_CALLER


class _Bound(ast.expr):
    """An expression of a function's (in reader's module), read where `call` calls it (its
    parameters bound to the call's arguments): a part of a tuple the function returns."""

    _fields = ("inner",)

    def __init__(self, inner, reader, function, call):
        super().__init__(inner=inner)
        self.reader, self.function, self.call = reader, function, call


def _joined(items, read):
    """read(item) for each item, concatenated; None where one of them cannot be read."""
    found = []
    for item in items:
        more = read(item)
        if more is None:
            return None
        found += more
    return found


def _bound(tuples, reader, function, call):
    return [
        t if isinstance(t, _AnyParts) else [_Bound(e, reader, function, call) for e in t]
        for t in tuples
    ]


class Reader:
    """Kinds of argument expressions and values of kernel names, in one module."""

    def __init__(self, module):
        self.m = module
        module.reader = self
        self.others = []  # the Readers of the other modules (CudaBackend's other mixins)
        self.bindings = []  # (function, call): the calls being followed into, innermost last
        self.memo = {}

    def literals(self, node, depth=0):
        """The Python values an expression of module constants may have (a dict indexed by
        a variable: any of its values); None where it is not one."""
        if depth > _DEPTH:
            return None
        if isinstance(node, ast.Constant):
            return [node.value]
        if (
            isinstance(node, ast.Name)
            and self.m.function_of(node) is None
            or (
                isinstance(node, ast.Name)
                and node.id in self.m.globals
                and not self.m.assignments(self.m.function_of(node), node.id)
            )
        ):
            try:
                return [ast.literal_eval(self.m.globals[node.id])]
            except (KeyError, ValueError, TypeError, SyntaxError):
                return None
        if isinstance(node, ast.Subscript):
            bases = self.literals(node.value, depth + 1)
            if bases is None:
                return None
            keys = self.literals(node.slice, depth + 1)
            out = []
            for base in bases:
                if keys is not None and all(_has(base, key) for key in keys):
                    out += [base[key] for key in keys]
                elif isinstance(base, dict):
                    out += list(base.values())
                elif isinstance(base, (tuple, list)):
                    out += list(base)
                else:
                    return None
            return out
        return None

    def returned(self, call):
        """[(reader, function, expression)] of what the function a call calls returns
        (self.f, be.f or a module function f; self.f of another mixin's module read by its
        reader); read the expression within reader.binding(function, call), where the
        function's parameters are that call's arguments."""
        f = call.func
        name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
        if isinstance(f, ast.Attribute) and ast.unparse(f.value) not in ("self", "be"):
            return []
        readers = [self] + (self.others if isinstance(f, ast.Attribute) else [])
        for reader in readers:
            found = [
                (reader, function, r.value)
                for function in reader.m.functions.get(name, [])
                for r in ast.walk(function)
                if isinstance(r, ast.Return) and r.value is not None
            ]
            if found:
                return found
        return []

    def from_returns(self, call, read):
        """read(reader, r) for each expression r the functions `call` names return, read
        with the call's arguments bound and bound to them in turn; None where one cannot
        be read."""
        found = []
        for reader, function, r in self.returned(call):
            with reader.binding(function, call):
                more = read(reader, r)
            if more is None:
                return None
            found += _bound(more, reader, function, call)
        return found

    def elements(self, node, depth=0):
        """The tuples (lists of part expressions) the elements of an iterated expression
        may be: a list built by appends, a literal, what a called function returns."""
        if depth > _DEPTH:
            return None
        if isinstance(node, _Bound):
            with node.reader.binding(node.function, node.call):
                found = node.reader.elements(node.inner, depth + 1)
            return None if found is None else _bound(found, node.reader, node.function, node.call)
        if isinstance(node, ast.IfExp) or (
            isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add)
        ):  # a + b, a if c else b: the elements of either
            if isinstance(node, ast.BinOp):
                parts = [node.left, node.right]
            else:
                parts = [node.body, node.orelse]
            return _joined(parts, lambda part: self.elements(part, depth + 1))
        if isinstance(node, (ast.List, ast.Tuple)):
            return _joined(node.elts, lambda e: self._tuples(e, depth + 1))
        if isinstance(node, ast.Call):
            return self.from_returns(node, lambda reader, r: reader.elements(r, depth + 1)) or None
        if isinstance(node, ast.Name):
            function = self.m.function_of(node)
            values = self._values_of(node, depth)
            if not values or function is None:
                return None
            found = _joined(values, lambda v: self.elements(v, depth + 1))
            if found is None:
                return None
            for call in ast.walk(function):  # name.append(x)
                if (
                    isinstance(call, ast.Call)
                    and isinstance(call.func, ast.Attribute)
                    and call.func.attr == "append"
                    and _is_name(call.func.value, node.id)
                ):
                    more = self._tuples(call.args[0], depth + 1)
                    if more is None:
                        return None
                    found += more
            return found
        return None

    def lengths(self, node, depth=0):
        """The lengths a list expression may have; None where they cannot be read."""
        if depth > _DEPTH:
            return None
        if isinstance(node, (ast.List, ast.Tuple)):
            return {len(node.elts)}
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            base, times = self.lengths(node.left, depth + 1), node.right
            if base and isinstance(times, ast.Constant) and isinstance(times.value, int):
                return {b * times.value for b in base}
            return None
        if isinstance(node, ast.IfExp):
            a, b = self.lengths(node.body, depth + 1), self.lengths(node.orelse, depth + 1)
            return None if a is None or b is None else a | b
        if isinstance(node, ast.Name):
            function = self.m.function_of(node)
            if function is None:
                return None
            base, added = None, []
            for n in ast.walk(function):
                if isinstance(n, ast.Assign) and any(_is_name(t, node.id) for t in n.targets):
                    if base is not None:
                        return None
                    base = self.lengths(n.value, depth + 1)
                elif isinstance(n, ast.AugAssign) and _is_name(n.target, node.id):
                    added.append(self.lengths(n.value, depth + 1))
            if base is None or None in added:
                return None
            totals = base
            for more in added:
                totals = {t + m for t in totals for m in more}
            return totals
        return None

    @contextlib.contextmanager
    def binding(self, function, call):
        self.bindings.append((function, call))
        try:
            yield
        finally:
            self.bindings.pop()

    def part_of(self, node, depth):
        """The expressions x[i] (i a constant) may be: the i-th of the tuples x is."""
        if not (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)):
            return None
        i = node.slice.value
        if isinstance(node.value, ast.Call) and ast.unparse(node.value.func) in _INT_HELPERS:
            return [ast.Call(func=ast.Name(id="int"), args=[], keywords=[])]
        tuples = self._tuples(node.value, depth + 1)
        if tuples is None and isinstance(node.value, ast.Call):
            tuples = self.from_returns(node.value, lambda reader, r: reader._tuples(r, depth + 1))
        if not tuples or not all(isinstance(i, int) and i < len(t) for t in tuples):
            return None
        return [t[i] for t in tuples]

    # ---- argument kinds --------------------------------------------------------------
    def kind(self, node, depth=0):
        key = (node, tuple(call for _, call in self.bindings))
        found = self.memo.get(key)
        if found is None:
            found = self._kind(node, depth)
            if found != UNKNOWN:  # (UNKNOWN may come of the depth reached)
                self.memo[key] = found
        return found

    def _kind(self, node, depth):
        if depth > _DEPTH:
            return UNKNOWN
        if isinstance(node, _Bound):
            with node.reader.binding(node.function, node.call):
                return node.reader.kind(node.inner, depth + 1)
        k = lambda n: self.kind(n, depth + 1)  # noqa: E731
        if isinstance(node, ast.Constant):
            if isinstance(node.value, bool):
                return INT
            if isinstance(node.value, int):
                return ZERO if node.value == 0 else INT
            if isinstance(node.value, float):
                return FLOAT
            return UNKNOWN
        if isinstance(node, ast.Call):
            return self._call_kind(node, depth)
        if isinstance(node, ast.Attribute):  # a field of a layer's object: a number
            return POINTER if node.attr == "ptr" else NUMBER
        if isinstance(node, ast.IfExp):
            return _union(k(node.body), k(node.orelse))
        if isinstance(node, ast.BoolOp):
            return _union(*map(k, node.values))
        if isinstance(node, ast.BinOp):
            sides = {k(node.left), k(node.right)}
            additive = isinstance(node.op, (ast.Add, ast.Sub))
            if additive and POINTER in sides:
                return POINTER if UNKNOWN not in sides else UNKNOWN  # pointer arithmetic
            if additive and UNKNOWN in sides:
                return UNKNOWN  # (it may be a pointer's)
            if POINTER in sides or UNKNOWN in sides:
                return NUMBER  # a pointer or a value * // % &..: a number (a % 16)
            if FLOAT in sides or isinstance(node.op, ast.Div):
                return FLOAT
            return NUMBER if NUMBER in sides else INT
        if isinstance(node, ast.UnaryOp):
            return INT if isinstance(node.op, ast.Not) else k(node.operand)
        if isinstance(node, ast.Compare):
            return INT
        if isinstance(node, ast.Name):
            return self._name_kind(node, depth)
        if isinstance(node, ast.Subscript):
            return self._subscript_kind(node, depth)
        return UNKNOWN

    def _call_kind(self, node, depth):
        func = ast.unparse(node.func)
        if func in _INT_CALLS:
            return INT
        if func in _FLOAT_CALLS:
            return FLOAT
        if func in _POINTER_CALLS or func.endswith("._ptr") or func == "_ptr":
            return POINTER
        # wgmma.py's maps, and nhwc.py's (tiled, and im2col for the images)
        if func in ("tensor_map", "tiled_map", "im2col_map") or func.endswith(".tensor_map"):
            return TENSOR_MAP
        if func == "_number_from_caller":
            return NUMBER
        if func == "next" and node.args and isinstance(node.args[0], ast.GeneratorExp):
            return self.kind(node.args[0].elt, depth + 1)
        if func in ("min", "max", "abs"):
            return _union(*(self.kind(a, depth + 1) for a in node.args))
        if func.endswith(".index") or func.endswith(".bit_length"):
            return INT
        if isinstance(node.func, ast.Name) and node.func.id not in self.m.functions:
            # a local alias (i = ctypes.c_int) or lambda
            values = self._values_of(node.func, depth)
            if values:
                kinds = []
                for v in values:
                    if isinstance(v, ast.Lambda):
                        kinds.append(self.kind(v.body, depth + 1))
                    else:
                        kinds.append(self._call_kind(ast.Call(func=v, args=[]), depth + 1))
                return _union(*kinds)
        if func in _INT_HELPERS:
            return INT
        returns = self.returned(node)
        if returns:
            kinds = []
            for reader, function, r in returns:
                with reader.binding(function, node):
                    kinds.append(reader.kind(r, depth + 1))
            return _union(*kinds)
        return UNKNOWN

    def _subscript_kind(self, node, depth):
        """A module constant's values, or a part of a tuple the code builds."""
        if ast.unparse(node.value) == "activations.ACTIVATION_IDS":
            return INT
        values = self.literals(node)
        if values is not None:
            return _union(*(_python_kind(v) for v in values))
        parts = self.part_of(node, depth)
        if parts is not None:
            return _union(*(self.kind(p, depth + 1) for p in parts))
        values = self._values_of(node.value, depth)  # an element of a list comprehension
        if values and all(isinstance(v, ast.ListComp) for v in values):
            return _union(*(self.kind(v.elt, depth + 1) for v in values))
        return UNKNOWN

    def _values_of(self, node, depth):
        """The expressions a name (or self.attribute) may hold where it is read."""
        if not isinstance(node, ast.Name):
            return None
        function = self.m.function_of(node)
        if function is None:
            value = self.m.globals.get(node.id)
            return [value] if value is not None else None
        found = self.m.assignments(function, node.id)
        if found:
            return found
        if found is None:
            return None
        # a parameter: what the module's calls of the function pass
        params = [a.arg for a in function.args.posonlyargs + function.args.args]
        if node.id not in params:
            value = self.m.globals.get(node.id)
            return [value] if value is not None else None
        bound = [call for f, call in self.bindings if f is function]
        if not bound and not function.name.startswith("_"):
            return [_FROM_CALLER]
        index = params.index(node.id)
        method = params and params[0] == "self"
        passed = []
        for call in bound[-1:] or self.m.callers(function):
            at = index - (1 if method and isinstance(call.func, ast.Attribute) else 0)
            keyword = [kw.value for kw in call.keywords if kw.arg == node.id]
            if keyword:
                passed.append(keyword[0])
            elif 0 <= at < len(call.args) and not any(
                isinstance(a, ast.Starred) for a in call.args[: at + 1]
            ):
                passed.append(call.args[at])
            else:
                defaults = function.args.defaults
                first_default = len(params) - len(defaults)
                if index >= first_default:
                    passed.append(defaults[index - first_default])
                else:
                    return None
        return passed or [_FROM_CALLER]

    def _name_kind(self, node, depth):
        if node.id in self.m.imported and node.id.isupper():
            return NUMBER  # another module's constant (REGION_TRUTHS)
        values = self._values_of(node, depth)
        if not values:
            return UNKNOWN
        return _union(*(self.kind(v, depth + 1) for v in values))

    # ---- arguments, with starred tuples expanded --------------------------------------
    def expanded(self, args, depth=0):
        """The argument lists ([expression]) an argument list may be, starred tuples written
        out (one list per way a starred name may be built); None where a starred one
        cannot be read."""
        outs = [[]]
        for a in args:
            if not isinstance(a, ast.Starred):
                outs = [out + [a] for out in outs]
                continue
            tuples = self._tuples(a.value, depth)
            if not tuples or any(isinstance(t, _AnyParts) for t in tuples):
                return None
            outs = [out + list(t) for out in outs for t in _distinct(tuples)]
            if len(outs) > 64:
                return None
        return outs

    def _tuples(self, node, depth):
        """The tuples (lists of element expressions) a starred expression may be."""
        if depth > _DEPTH:
            return None
        if isinstance(node, _Bound):
            with node.reader.binding(node.function, node.call):
                return node.reader._tuples(node.inner, depth + 1)
        if isinstance(node, ast.Constant) and node.value is None:
            return []  # `x or default` with x None: the default's
        if isinstance(node, (ast.Tuple, ast.List)):
            inner = self.expanded(node.elts, depth + 1)
            if inner is None:
                return None
            return inner
        if isinstance(node, ast.ListComp) and len(node.generators) == 1:
            lengths = self.lengths(node.generators[0].iter, depth + 1)
            if lengths is None:
                return None
            return [[node.elt] * n for n in sorted(lengths)]
        if isinstance(node, ast.Attribute):
            return [_AnyParts()]  # set elsewhere (a plan a benchmark forces)
        if isinstance(node, (ast.IfExp, ast.BoolOp)):
            parts = [node.body, node.orelse] if isinstance(node, ast.IfExp) else node.values
            return _joined(parts, lambda part: self._tuples(part, depth + 1))
        if isinstance(node, ast.Name):
            values = self._values_of(node, depth)
            if not values:
                return None
            return _joined(values, lambda v: self._tuples(v, depth + 1))
        if isinstance(node, ast.Call):
            return self.from_returns(node, lambda reader, r: reader._tuples(r, depth + 1)) or None
        if isinstance(node, ast.Subscript):
            values = self.literals(node)  # a module table's rows
            if values and all(isinstance(v, (tuple, list)) for v in values):
                return [[ast.Constant(x) for x in v] for v in values]
            parts = self.part_of(node, depth)
            if parts is None:
                return None
            return _joined(parts, lambda part: self._tuples(part, depth + 1))
        return None

    # ---- kernel names --------------------------------------------------------------
    def name_patterns(self, node, depth=0):
        """Regular expressions of the kernel names an expression may hold (a part read from
        nowhere: any word)."""
        if depth > _DEPTH:
            return [r"\w+"]
        p = lambda n: self.name_patterns(n, depth + 1)  # noqa: E731
        if isinstance(node, _Bound):
            with node.reader.binding(node.function, node.call):
                return node.reader.name_patterns(node.inner, depth + 1)
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [re.escape(node.value)]
        if isinstance(node, ast.JoinedStr):
            parts = [[""]]
            for v in node.values:
                if isinstance(v, ast.Constant):
                    parts.append([re.escape(v.value)])
                else:
                    parts.append(p(v.value))
            return _products(parts)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return _products([p(node.left), p(node.right)])
        if isinstance(node, ast.IfExp):
            return p(node.body) + p(node.orelse)
        if isinstance(node, ast.Name):
            values = self._values_of(node, depth)
            if values:
                return [pat for v in values for pat in p(v)]
        values = self.literals(node)
        if values is not None and all(isinstance(v, str) for v in values):
            return [re.escape(v) for v in values]
        if isinstance(node, ast.Subscript):
            parts = self.part_of(node, depth)
            if parts is not None:
                return [pat for part in parts for pat in p(part)]
        if isinstance(node, ast.Call):
            found = []
            for reader, function, r in self.returned(node):
                with reader.binding(function, node):
                    found += reader.name_patterns(r, depth + 1)
            if found:
                return found
        return [r"\w*"]


def _distinct(tuples):
    """tuples without repeats (the same expressions read twice)."""
    seen, out = set(), []
    for t in tuples:
        if isinstance(t, _AnyParts):
            out.append(t)
            continue
        key = tuple(ast.dump(e) for e in t)
        if key not in seen:
            seen.add(key)
            out.append(t)
    return out


def _products(parts):
    out = [""]
    for options in parts:
        out = [a + b for a in out for b in options]
    return out


def _has(container, key):
    try:
        container[key]
    except (KeyError, IndexError, TypeError):
        return False
    return True


def _python_kind(value):
    if isinstance(value, bool) or isinstance(value, int):
        return INT
    if isinstance(value, float):
        return FLOAT
    return UNKNOWN


def _union(*kinds):
    """The kind of an expression that may be any of `kinds`."""
    kinds = set(kinds)
    if UNKNOWN in kinds or not kinds:
        return UNKNOWN
    if len(kinds) == 1:
        return kinds.pop()
    if kinds <= {POINTER, ZERO}:
        return POINTER  # a pointer or null
    if kinds <= {INT, ZERO}:
        return INT
    if kinds <= {INT, ZERO, FLOAT, NUMBER}:
        return NUMBER
    return UNKNOWN


# (name argument's index, first kernel argument's index) of each launching call
_PYCUDA_LAUNCHES = {"_launch": (0, 3), "_launch_rows": (0, 3)}
_WGMMA_LAUNCH = (2, 5)


def launches(modules):
    """[(path, line, call, name index, first argument index, launcher)] of every launch;
    launcher "pycuda" (the families' kernel files), "wgmma" (gemm_wgmma.cu's, through
    ctypes) or "nhwc" (conv_nhwc.cu's, through wgmma.py's ctypes launch)."""
    found = []
    for path, tree in modules.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            if (
                path == NHWC_PY
                and isinstance(f, ast.Attribute)
                and f.attr == "_launch"
                and isinstance(f.value, ast.Name)
                and f.value.id == "wgmma"
            ):
                found.append((path, node.lineno, node, *_WGMMA_LAUNCH, "nhwc"))
            elif isinstance(f, ast.Attribute) and f.attr in _PYCUDA_LAUNCHES:
                if _inside(tree, node, "_launch_rows"):  # its callers are checked
                    continue
                found.append((path, node.lineno, node, *_PYCUDA_LAUNCHES[f.attr], "pycuda"))
            elif isinstance(f, ast.Name) and f.id == "_launch" and path == WGMMA_PY:
                found.append((path, node.lineno, node, *_WGMMA_LAUNCH, "wgmma"))
    return found


def _inside(tree, node, function_name):
    for f in ast.walk(tree):
        if isinstance(f, ast.FunctionDef) and f.name == function_name:
            if any(n is node for n in ast.walk(f)):
                return True
    return False


def check_launch(reader, call, name_at, args_at, kernels, where):
    """[problem] of one launch against `kernels` ({name: format}): the name must be some
    kernel's; each kernel it can be must take one of the argument lists the call can pass,
    and each of those lists must suit one of those kernels (a call whose argument list
    follows its kernel's name, as conv_tc_*_in16's extra argument does)."""
    patterns = reader.name_patterns(call.args[name_at])
    names = sorted(n for n in kernels if any(re.fullmatch(p, n) for p in patterns))
    if not names:
        named = ast.unparse(call.args[name_at])
        return [f"{where}: launches {named}, which no kernel file declares"]
    alternatives = reader.expanded(call.args[args_at:])
    if alternatives is None:
        return [f"{where}: its starred arguments cannot be read as tuples"]
    verdicts = {
        (name, i): _disagreement(reader, kernels[name], args)
        for name in names
        for i, args in enumerate(alternatives)
    }
    problems = []
    for name in names:
        found = [verdicts[name, i] for i in range(len(alternatives))]
        if all(found):
            problems.append(f"{where}: {name}: {min(found, key=len)}")
    for i in range(len(alternatives)):
        found = [verdicts[name, i] for name in names]
        if all(found) and len(alternatives) > 1:
            problems.append(f"{where}: argument list {i} suits none of {names}: {found[0]}")
    return problems


def _disagreement(reader, fmt, args):
    """Why arguments `args` do not suit a kernel taking `fmt` ('' if they do)."""
    if len(fmt) != len(args):
        return f"takes {len(fmt)} arguments ('{fmt}'), given {len(args)}"
    for i, (code, arg) in enumerate(zip(fmt, args)):
        kind = reader.kind(arg)
        if kind not in _ACCEPTS[code]:
            return f"argument {i} is '{code}', given {ast.unparse(arg)} ({_KIND_WORDS[kind]})"
    return ""


_KIND_WORDS = {
    POINTER: "a pointer",
    ZERO: "zero",
    INT: "an integer",
    FLOAT: "a float",
    NUMBER: "a number",
    TENSOR_MAP: "a tensor map",
    UNKNOWN: "of a kind that cannot be read",
}


def launch_problems(modules=None, kernel_dirs=None):
    """Every launch's problems against the declarations of the kernel files (found in
    kernel_dirs; None: the op families' folders)."""
    modules = launcher_modules() if modules is None else modules
    pycuda = kernel_signatures.kernel_table(family_kernel_files(modules), kernel_dirs)
    pycuda_kernels = {n: f for entries in pycuda.values() for n, f in entries.items()}
    by_launcher = {
        "pycuda": pycuda_kernels,
        "wgmma": kernel_signatures.signatures(WGMMA_FILES[0], kernel_dirs),
        "nhwc": kernel_signatures.signatures(NHWC_FILE, kernel_dirs),
    }
    readers = {path: Reader(_Module(tree)) for path, tree in modules.items()}
    for reader in readers.values():
        reader.others = [r for r in readers.values() if r is not reader]
    problems = []
    for path, line, call, name_at, args_at, launcher in launches(modules):
        where = f"{path.relative_to(ROOT)}:{line}"
        kernels = by_launcher[launcher]
        problems += check_launch(readers[path], call, name_at, args_at, kernels, where)
    return problems


# =============================================================================


def test_every_launch_agrees_with_its_kernels_declaration():
    modules = launcher_modules()
    assert len(launches(modules)) > 100  # the launches are found where they are
    problems = launch_problems(modules)
    assert not problems, "\n".join(problems)


def launched_kernels(modules, kernels, launcher="pycuda"):
    """The names in `kernels` that some launch of `launcher` (launches()) can name."""
    readers = {path: Reader(_Module(tree)) for path, tree in modules.items()}
    for reader in readers.values():
        reader.others = [r for r in readers.values() if r is not reader]
    found = set()
    for path, _, call, name_at, _, by in launches(modules):
        if by == launcher:
            patterns = readers[path].name_patterns(call.args[name_at])
            found |= {n for n in kernels if any(re.fullmatch(p, n) for p in patterns)}
    return found


def test_every_declared_kernel_is_one_a_launch_names():
    # A kernel no launch is read to name would go unchecked: each entry point of the files
    # the families load, and of gemm_wgmma.cu, is one a launch's name can be.
    modules = launcher_modules()
    table = kernel_signatures.kernel_table(family_kernel_files(modules))
    declared = {n for entries in table.values() for n in entries}
    assert len(declared) > 250
    assert declared - launched_kernels(modules, declared) == set()
    wgmma = kernel_signatures.signatures(WGMMA_FILES[0])
    assert set(wgmma) - launched_kernels(modules, wgmma, "wgmma") == set()
    # conv_nhwc.cu includes gemm_wgmma.cu for its pipeline: its own kernels are the rest
    nhwc = {n: f for n, f in kernel_signatures.signatures(NHWC_FILE).items() if n not in wgmma}
    assert len(nhwc) == 8
    assert set(nhwc) - launched_kernels(modules, nhwc, "nhwc") == set()


def test_the_solo_wgmma_file_declares_the_same_kernels():
    # wgmma.py launches either build with the same arguments.
    first, solo = (kernel_signatures.signatures(name) for name in WGMMA_FILES)
    assert first == solo
    assert first["wgmma_gemm_f16"].startswith("TTT")  # three tensor maps by value


def _edited_modules(path_end, old, new):
    """launcher_modules() with `old` replaced by `new` (once) in the module at path_end."""
    modules = {}
    for path in launcher_modules():
        text = path.read_text()
        if str(path).endswith(path_end):
            assert text.count(old) == 1, f"{old!r} is not once in {path}"
            text = text.replace(old, new)
        modules[path] = ast.parse(text)
    return modules


def _edited_kernels(tmp_path, filename, old, new):
    """A copy of the kernel folders with `old` replaced by `new` (everywhere) in `filename`."""
    import shutil

    dirs = []
    for folder in prebuilt.KERNEL_DIRS:
        copy = tmp_path / "ops" / Path(folder).name
        shutil.copytree(folder, copy)
        dirs.append(str(copy))
        if (copy / filename).is_file():
            text = (copy / filename).read_text()
            assert old in text, f"{old!r} is not in {filename}"
            (copy / filename).write_text(text.replace(old, new))
    return dirs


LAUNCH_EDITS = [
    # (module, launcher text, edited, what the test must say)
    (  # an argument left out: the count
        "pooling/cuda.py",
        "self._ptr(indexes),\n            int(n_out),\n            self._ptr(delta_in),\n",
        "self._ptr(indexes),\n            self._ptr(delta_in),\n",
        "maxpool_backward_kernel: takes 4 arguments ('PPiP'), given 3",
    ),
    (  # an int where the kernel takes a pointer
        "pooling/cuda.py",
        "            int(n_out),\n            self._ptr(delta_in),\n",
        "            int(n_out),\n            int(n_out),\n",
        "maxpool_backward_kernel: argument 3 is 'P', given int(n_out) (an integer)",
    ),
    (  # a pointer where the kernel takes an int
        "elementwise/cuda.py",
        '"sum_final_f32", (1,), (_BLOCK,), blocks, partial, self._ptr(out)',
        '"sum_final_f32", (1,), (_BLOCK,), partial, partial, self._ptr(out)',
        "sum_final_f32: argument 0 is 'i', given partial (a pointer)",
    ),
    (  # a float where the kernel takes an int (through a starred tuple)
        "convolution/cuda.py",
        "_NO_EPILOGUE = (0, activations.ACTIVATION_IDS[\"linear\"])",
        "_NO_EPILOGUE = (0, 1.0)",
        "is 'i', given 1.0 (a float)",
    ),
    (  # a float kernel argument given an int (wgmma.py's ctypes launch)
        "convolution/wgmma.py",
        "        f(out_alpha),\n",
        "        i(out_alpha),\n",
        "wgmma_gemm_bf16: argument 6 is 'f', given i(out_alpha) (an integer)",
    ),
    (  # a kernel name that no file declares
        "losses/cuda.py",
        '"loss_final",',
        '"loss_finale",',
        "launches 'loss_finale', which no kernel file declares",
    ),
]


@pytest.mark.parametrize("module, old, new, says", LAUNCH_EDITS)
def test_a_launch_that_disagrees_with_its_kernel_fails(module, old, new, says):
    problems = launch_problems(_edited_modules(module, old, new))
    assert problems, f"no problem found after editing {module}"
    assert any(says in p for p in problems), "\n".join(problems)


KERNEL_EDITS = [
    # (kernel file, declaration text, edited, what the test must say)
    (  # a parameter more (a plain entry point)
        "pooling.cu",
        "maxpool_backward_kernel(const float* __restrict__ delta_out,",
        "maxpool_backward_kernel(int extra, const float* __restrict__ delta_out,",
        "maxpool_backward_kernel: takes 5 arguments ('iPPiP'), given 4",
    ),
    (  # an int parameter made a float (an entry point of a macro, X-macro expanded)
        "gemm_tc.cuh",
        "pack_weights_##PREC(const float* in, int rows, int k, int pitch,",
        "pack_weights_##PREC(const float* in, int rows, int k, float pitch,",
        "pack_weights_bf16: argument 3 is 'f', given pitch (an integer)",
    ),
    (  # a pointer made a long long (conv_backward_entries.cuh's weight gradient entries)
        "conv_backward_entries.cuh",
        "const float* delta, long long delta_stride, const float* im,",
        "const float* delta, long long delta_stride, long long im,",
        "argument 2 is 'q', given self._ptr(im) (a pointer)",
    ),
    (  # wgmma's kernel loses its last parameter
        "gemm_wgmma.cu",
        "long long image_stride, const float* bias, int act)",
        "long long image_stride, const float* bias)",
        "takes 16 arguments",
    ),
]


@pytest.mark.parametrize("filename, old, new, says", KERNEL_EDITS)
def test_a_kernel_declaration_that_disagrees_with_its_launch_fails(
    tmp_path, filename, old, new, says
):
    dirs = _edited_kernels(tmp_path, filename, old, new)
    problems = launch_problems(kernel_dirs=dirs)
    assert problems, f"no problem found after editing {filename}"
    assert any(says in p for p in problems), "\n".join(problems[:20])
