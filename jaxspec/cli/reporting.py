"""What generate and chat say about a run on stderr: whether its tokens are greedy's, and
chat's statistics line."""

from __future__ import annotations


def jax_backend() -> str:
    import jax

    return jax.default_backend()


def identical_to_greedy(model, prompt_ids, tokens, greedy_tokens) -> str:
    """"identical to greedy: yes", or where the outputs part and whether the two disputed
    tokens' logits are a near-tie at the model's dtype (`jaxspec.exactness`)."""
    from jaxspec import exactness

    difference = exactness.compare(model, prompt_ids, greedy_tokens, tokens)
    numerics = " (batch-invariant numerics)" if getattr(model, "batch_invariant", False) else ""
    return f"identical to greedy: yes{numerics}" if difference is None else \
        f"identical to greedy: NO{numerics}, {difference.describe(model.dtype)}"


STATS_WIDTH = 80  # columns of chat's statistics line


def _fit(parts: dict[str, tuple[str, ...]], plan: list[str], width: int = STATS_WIDTH) -> str:
    """`parts` joined by "; ", each in one of its forms (longest first; "" leaves it out): while the
    line is wider than `width`, the next part `plan` names takes its next form."""
    chosen = dict.fromkeys(parts, 0)

    def line() -> str:
        return "; ".join(form for name, forms in parts.items() if (form := forms[chosen[name]]))

    for name in plan:
        if len(line()) <= width:
            break
        if name in parts and chosen[name] + 1 < len(parts[name]):
            chosen[name] += 1
    text = line()
    return text if len(text) <= width else text[:width - 3] + "..."


def _secs(seconds: float) -> str:
    """Seconds to 2-3 significant digits (a short reply decodes in milliseconds)."""
    return f"{seconds:.3f}" if seconds < 1 else f"{seconds:.2f}" if seconds < 10 else f"{seconds:.1f}"


def stats_lines(model, out, prompt_ids, greedy=None, cut_at: int | None = None) -> list[str]:
    """A reply's statistics in one line of at most STATS_WIDTH columns: tokens, the decoding's own
    seconds and tokens/s (compiling not counted: said apart), S, whether `auto` was trying the setting; with
    `greedy`, a second line comparing the two (and a hint when the method is slower)."""
    setting = ("greedy" if out.method == "autoregressive" else out.method) + (
        f" K={out.options['draft_len']}" if "draft_len" in out.options else "") + (
        f" + lookup G={out.options['lookup_guesses']}" if out.options.get("lookup_guesses") else "") + (
        " routed" if out.options.get("lookup_route") else "") + (
        f" +{out.options['first_alternatives']} alt" if out.options.get("first_alternatives") else "")
    n, trying, secs, rate = len(out.tokens), (out.auto or {}).get("trying"), _secs(out.seconds), \
        f"{out.tokens_per_second:.1f}"
    compact = setting.replace(" + lookup ", "+lookup ")
    parts = {"rate": (f"[{setting}] {n} tokens in {secs} s: {rate} tokens/s",
                      f"[{setting}] {n} tokens, {secs} s, {rate} tok/s", f"[{setting}] {n} tok, {secs} s, {rate} tok/s",
                      f"[{compact}] {n} tok, {secs} s, {rate} tok/s")}
    if out.compile_seconds > 0:
        parts["compile"] = (f"compiled in {out.compile_seconds:.1f} s", f"compile {out.compile_seconds:.1f} s",
                            f"compile {out.compile_seconds:.0f} s")
    parts["S"] = (f"S {out.compression:.2f} ({out.steps} steps)", f"S {out.compression:.2f}", "")
    if trying:  # a setting `auto` tries to learn its rate here (`jaxspec.runtime.auto`)
        parts["auto"] = ("auto is trying it", "auto trying", "")
    plain = ((out.auto or {}).get("step_modes") or {}).get("plain_steps", 0)
    if plain:  # chunks stepped without drafts (`jaxspec.runtime.step_modes`)
        parts["modes"] = (f"{plain} of {out.steps} steps plain", f"{plain} plain", "")
    if getattr(model, "batch_invariant", False):  # (`jaxspec.models.batch_invariant`)
        parts["numerics"] = ("batch-invariant", "invariant", "")
    if cut_at is not None:
        parts["cut"] = (f"cut at --max-new-tokens {cut_at}", "cut at the limit", "cut")
    # shorter wording first, then the least needed parts left out; tokens, tokens/s and compile stay
    lines = [_fit(parts, ["cut", "S", "numerics", "auto", "modes", "compile", "cut", "auto", "modes", "S", "numerics",
                          "rate", "rate", "compile", "rate"])]
    if greedy is not None:
        speedup = out.tokens_per_second / max(greedy.tokens_per_second, 1e-9)
        lines.append(f"[greedy] {greedy.tokens_per_second:.1f} tokens/s, speed-up {speedup:.2f}x; "
                     + identical_to_greedy(model, prompt_ids, out.tokens, greedy.tokens))
        if speedup < 1:
            lines.append(f"hint: {out.method} is slower than greedy on this device ({jax_backend()}); "
                         "--method auto picks the fastest setting here")
    return lines
