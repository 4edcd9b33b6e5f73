"""Darknet's learning-rate policies (get_current_rate), with burn_in and power, and the
AlexeyAB fork's sgdr (cosine annealing with warm restarts)."""

import math

from .plurals import counted

POLICIES = ("constant", "step", "steps", "exp", "poly", "sigmoid", "random", "sgdr")


def read_policy(s):
    """Read the policy options of a [net] section into a dict (errors name the line)."""
    name = s.get_str("policy", "constant")
    if name == "sig":
        name = "sigmoid"
    if name not in POLICIES:
        raise s.error(
            f"unknown learning-rate policy '{name}' (known: {', '.join(POLICIES)})", "policy"
        )
    p = {"policy": name, "burn_in": s.get_int("burn_in", 0), "power": s.get_float("power", 4.0)}
    if name == "step":
        p["step"] = s.get_int("step", 1)
        p["scale"] = s.get_float("scale", 1.0)
    elif name == "steps":
        steps = s.get_int_list("steps")
        scales = s.get_float_list("scales")
        if steps is None or scales is None:
            raise s.error("policy=steps needs both steps= and scales=", "policy")
        if len(steps) != len(scales):
            raise s.error(
                f"{counted(len(steps), 'step')} but {counted(len(scales), 'scale')}", "scales"
            )
        p["steps"], p["scales"] = steps, scales
    elif name == "exp":
        p["gamma"] = s.get_float("gamma", 1.0)
    elif name == "sigmoid":
        p["gamma"] = s.get_float("gamma", 1.0)
        p["step"] = s.get_int("step", 1)
    elif name == "sgdr":
        read_sgdr(s, p)
    return p


def read_sgdr(s, p):
    """The fork's sgdr options: the first cycle lasts sgdr_cycle updates (default
    max_batches, so one cosine over the run), each next one sgdr_mult times longer; the
    rate falls from learning_rate to learning_rate_min within a cycle."""
    p["rate_min"] = s.get_float("learning_rate_min", 0.00001)
    p["cycle"] = s.get_int("sgdr_cycle") if s.has("sgdr_cycle") else None
    p["cycle_mult"] = s.get_int("sgdr_mult", 2)
    if p["cycle"] is not None and p["cycle"] < 1:
        raise s.error(f"must be at least 1, got {p['cycle']}", "sgdr_cycle")
    if p["cycle_mult"] < 1:
        # The fork's cycle loop never ends with a multiplier of 0.
        raise s.error(f"must be at least 1, got {p['cycle_mult']}", "sgdr_mult")
    for key in ("steps", "scales"):
        # The fork parses them with sgdr too, but its sgdr rate never looks at them.
        if s.get_str(key, None) is not None:
            s.warn(
                "does not change the rate with policy=sgdr (the fork reads it and ignores it)", key
            )


def current_rate(base_rate, policy, batch_num, max_batches, rng=None):
    """The learning rate Darknet applies at update number `batch_num`."""
    burn_in = policy["burn_in"]
    if batch_num < burn_in:
        return base_rate * math.pow(batch_num / burn_in, policy["power"])
    name = policy["policy"]
    if name == "constant":
        return base_rate
    if name == "step":
        return base_rate * math.pow(policy["scale"], batch_num // policy["step"])
    if name == "steps":
        rate = base_rate
        for step, scale in zip(policy["steps"], policy["scales"]):
            if step > batch_num:
                break
            rate *= scale
        return rate
    if name == "exp":
        return base_rate * math.pow(policy["gamma"], batch_num)
    if name == "poly":
        return base_rate * math.pow(
            max(0.0, 1.0 - batch_num / max(1, max_batches)), policy["power"]
        )
    if name == "random":
        u = rng.random() if rng is not None else 0.5
        return base_rate * math.pow(u, policy["power"])
    if name == "sigmoid":
        return base_rate * (1.0 / (1.0 + math.exp(policy["gamma"] * (batch_num - policy["step"]))))
    if name == "sgdr":
        return sgdr_rate(base_rate, policy, batch_num, max_batches)
    raise ValueError(name)


def sgdr_rate(base_rate, policy, batch_num, max_batches):
    """The fork's SGDR case: find the cycle batch_num falls in (a cycle ends inclusively,
    so batch_num == its end is still the cycle's last, lowest rate), then cosine-anneal."""
    start, size = 0, policy["cycle"] or max(1, max_batches)
    while start + size < batch_num:
        start += size
        size *= policy["cycle_mult"]
    low = policy["rate_min"]
    return low + 0.5 * (base_rate - low) * (1.0 + math.cos((batch_num - start) * math.pi / size))
