"""Darknet's learning-rate policies (get_current_rate), with burn_in and power."""
import math

POLICIES = ("constant", "step", "steps", "exp", "poly", "sigmoid", "random")


def read_policy(s):
    """Read the policy options of a [net] section into a dict (errors name the line)."""
    name = s.get_str("policy", "constant")
    if name == "sig":
        name = "sigmoid"
    if name not in POLICIES:
        raise s.error(f"unknown learning-rate policy '{name}' (known: {', '.join(POLICIES)})",
                      "policy")
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
            raise s.error(f"{len(steps)} steps but {len(scales)} scales", "scales")
        p["steps"], p["scales"] = steps, scales
    elif name == "exp":
        p["gamma"] = s.get_float("gamma", 1.0)
    elif name == "sigmoid":
        p["gamma"] = s.get_float("gamma", 1.0)
        p["step"] = s.get_int("step", 1)
    return p


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
        return base_rate * math.pow(max(0.0, 1.0 - batch_num / max(1, max_batches)), policy["power"])
    if name == "random":
        u = rng.random() if rng is not None else 0.5
        return base_rate * math.pow(u, policy["power"])
    if name == "sigmoid":
        return base_rate * (1.0 / (1.0 + math.exp(policy["gamma"] * (batch_num - policy["step"]))))
    raise ValueError(name)
