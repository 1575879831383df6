"""Gradient accumulation: no_sync under DDP, the private sync flag, the step's counter,
and the loss that must be divided by the number of micro-steps."""

from __future__ import annotations

import ast

from phalanx.lint.engine import Context, Rule, dotted, keyword, last
from phalanx.lint.syntax import subtree, walk

OPTIMIZER_NAMES = ("opt", "optim", "optimizer", "optimiser", "scaler", "grad_scaler")
OPTIMIZER_MAKERS = ("Optimizer", "GradScaler", "ZeroRedundancyOptimizer")
LOOPS = (ast.For, ast.AsyncFor, ast.While)


def _steps_optimizer(ctx: Context, call: ast.Call) -> bool:
    """`call` is `X.step()` of an optimizer or a GradScaler — not of an LR scheduler:
    X assigned from `torch.optim.*`/`optim.*`/a name with Optimizer/GradScaler, or
    named like one (`opt`, `optimizer`, `self.optim`, `scaler`)."""
    if not (isinstance(call.func, ast.Attribute) and call.func.attr == "step"):
        return False
    receiver = call.func.value
    if isinstance(receiver, ast.Subscript):  # optimizers[0].step()
        receiver = receiver.value
    name = dotted(receiver)
    if not name:
        return False
    made = [dotted(n.value) for n in ctx.of(ast.Assign)
            if isinstance(n.value, ast.Call) and any(dotted(t) == name for t in n.targets)]
    if any("lr_scheduler" in m or "sched" in m.lower() for m in made):
        return False
    if any(m.startswith(("torch.optim.", "optim.")) or any(w in m for w in OPTIMIZER_MAKERS)
           for m in made):
        return True
    short = last(name).lower()
    return "sched" not in short and (short in OPTIMIZER_NAMES or short.endswith(
        ("_opt", "_optim", "_optimizer", "optimizer", "_scaler")))


def _loop_of(ctx: Context, node: ast.AST) -> ast.AST | None:
    """The innermost loop `node` is in, within its function."""
    for a in ctx.ancestors(node):
        if isinstance(a, LOOPS):
            return a
        if isinstance(a, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return None
    return None


def _accumulation_guards(ctx: Context) -> list[tuple[ast.If, ast.AST]]:
    """`(if step % K ...:, its loop)` guarding an optimizer's (or scaler's) step —
    accumulation by hand — in a loop body."""
    found: list[tuple[ast.If, ast.AST]] = []
    for call in ctx.calls_named("step"):
        if not _steps_optimizer(ctx, call):
            continue
        for parent in ctx.ancestors(call):
            if isinstance(parent, (*LOOPS, ast.FunctionDef, ast.AsyncFunctionDef)):
                break
            if isinstance(parent, ast.If) and any(isinstance(n, ast.BinOp) and
                                                  isinstance(n.op, ast.Mod)
                                                  for n in walk(parent.test)):
                loop = _loop_of(ctx, parent)
                if loop is not None and all(parent is not g for g, _ in found):
                    found.append((parent, loop))
                break
    return found


def _accumulated_backwards(ctx: Context):
    """(backward call, its accumulation guard): backwards in the same loop body as an
    accumulation guard, not under it."""
    guards = _accumulation_guards(ctx)
    for call in ctx.calls_named("backward"):
        loop = _loop_of(ctx, call)
        for guard, guarded in guards:
            if loop is guarded and guard not in ctx.ancestors(call) \
                    and not _steps_every_time(ctx, call, loop):
                yield call, guard
                break


def _steps_every_time(ctx: Context, call: ast.Call, loop: ast.AST) -> bool:
    """The backward is in a block (a branch, or the loop's body) that also steps the
    optimizer unconditionally: `if K > 1: ... else: loss.backward(); opt.step()` — that
    arm updates on every iteration, no accumulation there."""
    child: ast.AST = call
    for parent in ctx.ancestors(call):
        for name in ("body", "orelse"):
            block = getattr(parent, name, None)
            if isinstance(block, list) and child in block and any(
                    _steps_optimizer(ctx, c) and _unconditional(ctx, c, block)
                    for stmt in block for c in walk(stmt) if isinstance(c, ast.Call)):
                return True
        if parent is loop:
            return False
        child = parent
    return False


def _unconditional(ctx: Context, call: ast.Call, block: list[ast.stmt]) -> bool:
    """`call` runs whenever `block` does: no `if`, loop or function between them."""
    for parent in ctx.ancestors(call):
        if parent in block:
            return not isinstance(parent, (ast.If, *LOOPS, ast.FunctionDef,
                                           ast.AsyncFunctionDef, ast.Try))
        if isinstance(parent, (ast.If, ast.IfExp, *LOOPS, ast.FunctionDef,
                               ast.AsyncFunctionDef, ast.Lambda, ast.Try)):
            return False
    return False


def _accumulation_without_no_sync(ctx: Context):
    if not ctx.mentions("DistributedDataParallel", "DDP") or ctx.mentions("no_sync"):
        return
    for call, guard in _accumulated_backwards(ctx):
        yield call, (f"(optimizer steps every few micro-steps, `if {ast.unparse(guard.test)}` "
                     f"at line {guard.lineno}, but every backward all-reduces)")


def _private_sync_flag(ctx: Context):
    """Setting the flag; not reported where the file also sets it back (a framework's
    own context manager that restores it: Accelerate, Lightning, torch's replicate), nor
    where it is set inside a loop to a value computed there (`= micro_step == last`, on
    every micro-step: no_sync()'s semantics, never left off) — only a constant can be."""
    sets = [node for node in ctx.of(ast.Assign) if any(
        isinstance(t, ast.Attribute) and t.attr == "require_backward_grad_sync"
        for t in node.targets)]
    if len(sets) == 1 and (isinstance(sets[0].value, ast.Constant)
                           or (_loop_of(ctx, sets[0]) is None
                               and not _a_parameter(ctx, sets[0].value))):
        yield sets[0], ""


def _a_parameter(ctx: Context, value: ast.AST) -> bool:
    """`value` is a parameter of the function the assignment is in: its callers decide it
    (`set_sync(model, i == last)` on every micro-step is no_sync()'s semantics)."""
    func = ctx.function_of(value)
    return isinstance(value, ast.Name) and isinstance(func, (ast.FunctionDef,
                                                             ast.AsyncFunctionDef)) \
        and value.id in {a.arg for a in (*func.args.posonlyargs, *func.args.args,
                                         *func.args.kwonlyargs)}


def _zero_based_counters(ctx: Context) -> dict[str, ast.For]:
    """Loop variables that start at 0: `for i, b in enumerate(x)`, `for i in range(n)`."""
    found = {}
    for loop in (n for n in ctx.of(ast.For)):
        it, target = loop.iter, loop.target
        if not isinstance(it, ast.Call) or keyword(it, "start") is not None:
            continue
        name = last(dotted(it))
        if name == "enumerate" and len(it.args) == 1 and isinstance(target, ast.Tuple) \
                and isinstance(target.elts[0], ast.Name):
            found[target.elts[0].id] = loop
        elif name == "range" and isinstance(target, ast.Name) and (
                len(it.args) == 1 or (isinstance(it.args[0], ast.Constant)
                                      and it.args[0].value == 0)):
            found[target.id] = loop
    return found


def _off_by_one(ctx: Context):
    """`if i % K == 0: optimizer.step()` with i counting from 0 steps after the first
    micro-batch, then every K: the first window is one micro-batch, and (when the
    length is a multiple of K) the last K-1 micro-batches are never applied."""
    counters = _zero_based_counters(ctx)
    if not counters:
        return
    for call in ctx.calls_named("step"):
        guard = next((a for a in ctx.ancestors(call) if isinstance(a, ast.If)), None)
        test = guard.test if guard is not None else None
        if isinstance(test, ast.Compare) and len(test.ops) == 1 and \
                isinstance(test.ops[0], ast.Eq) and isinstance(test.left, ast.BinOp) and \
                isinstance(test.left.op, ast.Mod) and isinstance(test.left.left, ast.Name) \
                and test.left.left.id in counters and \
                isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value == 0:
            assert guard is not None  # test is guard's
            counter = test.left.left.id
            if not _backward_outside(ctx, counters[counter], guard) or \
                    not _steps_optimizer(ctx, call):
                continue
            yield guard, (f"(`{ast.unparse(test)}` holds at {counter} = 0, which counts from 0 "
                          f"at line {counters[counter].lineno}: the first step comes after one "
                          f"micro-batch)")


def _divided(node: ast.AST) -> bool:
    return any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div) for n in walk(node))


def _divided_before(ctx: Context, name: str, call: ast.Call) -> bool:
    """`loss = ... / K` or `loss /= K` on the backward's path."""
    for stmt in ctx.before(call):
        for node in walk(stmt):
            if isinstance(node, ast.AugAssign) and dotted(node.target) == name \
                    and isinstance(node.op, ast.Div):
                return True
            if isinstance(node, ast.Assign) and any(dotted(t) == name for t in node.targets) \
                    and _divided(node.value):
                return True
    return False


def _returns_divided(func: ast.AST) -> bool:
    """A function whose returned value is divided: `return loss / k`, or a name it
    divides (`loss = loss / k`, `loss /= k`) returned."""
    for node in subtree(func):
        if isinstance(node, ast.Return) and node.value is not None:
            if _divided(node.value):
                return True
            names = {dotted(n) for n in walk(node.value) if isinstance(n, ast.Name)}
            if any(isinstance(a, ast.AugAssign) and isinstance(a.op, ast.Div)
                   and dotted(a.target) in names or isinstance(a, ast.Assign)
                   and _divided(a.value) and any(dotted(t) in names for t in a.targets)
                   for a in subtree(func)):
                return True
    return False


def _from_dividing_helper(ctx: Context, name: str, call: ast.Call) -> bool:
    """`loss = compute_loss(...)` (or `loss, logs = ...`) on the backward's path, with
    `compute_loss` a function of this file whose returns are divided."""
    assigns = [n for stmt in ctx.before(call) for n in walk(stmt)
               if isinstance(n, ast.Assign) and any(
                   dotted(t) == name or isinstance(t, ast.Tuple)
                   and any(dotted(e) == name for e in t.elts) for t in n.targets)]
    if not assigns:
        return False
    value = max(assigns, key=lambda n: n.lineno).value
    value = value.value if isinstance(value, ast.Await) else value
    if not isinstance(value, ast.Call):
        return False
    callee = last(dotted(value))
    return any(_returns_divided(f) for f in ctx.nodes
               if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.name == callee)


def _undivided_accumulation(ctx: Context):
    """Accumulation by hand whose `loss.backward()` adds each micro-step's full gradient."""
    for call, guard in _accumulated_backwards(ctx):
        if call.args or not isinstance(call.func, ast.Attribute):
            continue  # `accelerator.backward(loss)` / `acc.backward(loss)` divide themselves
        loss = call.func.value
        if isinstance(loss, ast.Call) and last(dotted(loss)) == "scale" and loss.args:
            loss = loss.args[0]  # scaler.scale(loss).backward()
        if _divided(loss) or (isinstance(loss, (ast.Name, ast.Attribute)) and (
                _divided_before(ctx, dotted(loss), call)
                or _from_dividing_helper(ctx, dotted(loss), call))):
            continue
        mod = next(n for n in walk(guard.test) if isinstance(n, ast.BinOp)
                   and isinstance(n.op, ast.Mod))
        every = ast.unparse(mod.right)
        yield call, (f"(the optimizer steps every `{every}` micro-steps; each backward adds its "
                     f"whole gradient, so the update is `{every}` × the mean's)")


def _backward_outside(ctx: Context, loop: ast.For, guard: ast.If) -> bool:
    """A backward in the loop's own body on every iteration, not only under the guard."""
    return any(guard not in ctx.ancestors(c) and _loop_of(ctx, c) is loop
               for c in ctx.calls_named("backward"))


RULES = [
    Rule("PX401", "warning", "Gradient accumulation with DDP but no `no_sync()`: gradients "
         "are all-reduced on every micro-step.",
         "Wrap all but the last micro-step in `with model.no_sync():` (or `run.accumulate`).",
         "model = DDP(net)\nfor i, (x, y) in enumerate(loader):\n"
         "    loss_fn(model(x), y).backward()  # <-\n    if (i + 1) % 4 == 0:\n"
         "        opt.step()\n        opt.zero_grad()",
         "model = DDP(net)\nfor i, (x, y) in enumerate(loader):\n"
         "    sync = (i + 1) % 4 == 0\n    with (nullcontext() if sync else model.no_sync()):\n"
         "        loss_fn(model(x), y).backward()\n    if sync:\n        opt.step()\n"
         "        opt.zero_grad()", _accumulation_without_no_sync),
    Rule("PX402", "error", "Setting DDP's private `require_backward_grad_sync`: unsupported, "
         "and easy to leave off.", "Use the `model.no_sync()` context manager.",
         "model.require_backward_grad_sync = False  # <-",
         "with model.no_sync():\n    loss.backward()", _private_sync_flag),
    Rule("PX403", "warning", "Off-by-one gradient accumulation: the optimizer steps when a "
         "0-based counter is a multiple of K, so the first window is a single micro-batch.",
         "Step when `(i + 1) % K == 0` (and use the same test for `no_sync`).",
         "for i, (x, y) in enumerate(loader):\n    loss_fn(model(x), y).backward()\n"
         "    if i % 4 == 0:  # <-\n        opt.step()\n        opt.zero_grad()",
         "for i, (x, y) in enumerate(loader):\n    loss_fn(model(x), y).backward()\n"
         "    if (i + 1) % 4 == 0:\n        opt.step()\n        opt.zero_grad()", _off_by_one),
    Rule("PX404", "warning", "Gradient accumulation whose loss is not divided by the number "
         "of micro-steps: the update is K times too large (as if the learning rate were).",
         "Backward `loss / K` (or use `run.accumulate`, Accelerate's `accumulate`).",
         "for i, (x, y) in enumerate(loader):\n    loss = loss_fn(model(x), y)\n"
         "    loss.backward()  # <-\n    if (i + 1) % 4 == 0:\n        opt.step()\n"
         "        opt.zero_grad()",
         "for i, (x, y) in enumerate(loader):\n    loss = loss_fn(model(x), y) / 4\n"
         "    loss.backward()\n    if (i + 1) % 4 == 0:\n        opt.step()\n"
         "        opt.zero_grad()", _undivided_accumulation),
]
