"""``orch rent``: rent a marketplace instance (vast.ai, RunPod) and add it as a host."""

from __future__ import annotations

import shlex
from pathlib import Path

import click
from pydantic import ValidationError

from orchestrator.access import keys
from orchestrator.access.power import login, remember_price
from orchestrator.access.provisioned import bring_up
from orchestrator.ask import confirm
from orchestrator.cli.app import App, pass_app
from orchestrator.errors import UsageError
from orchestrator.hosts.inventory import DEFAULT_ROOT, LOCAL, Host, ProviderRef
from orchestrator.providers.api import ProviderError, Wanted
from orchestrator.providers.open import open_named
from orchestrator.providers.registry import PROVIDERS, RENTABLE
from orchestrator.spec.model import ENV_KEY_RE


@click.command("rent")
@click.argument("name")
@click.option("--provider", type=click.Choice(RENTABLE), required=True, help="The marketplace.")
@click.option("--gpu", required=True, help="GPU type, e.g. RTX_4090, \"A100 80GB\" (matched loosely).")
@click.option("--count", type=click.IntRange(1, 16), default=1, show_default=True, help="GPUs in the instance.")
@click.option("--max-price", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Most USD per hour for the whole instance.")
@click.option("--disk", "disk_gb", type=click.IntRange(5, 10000), default=40, show_default=True,
              help="Disk in GB (RunPod: the volume at /workspace, kept while stopped).")
@click.option("--min-reliability", type=click.FloatRange(0, 1), default=None,
              help="Least reliability an offer may have (vast: 0.95 unless given).")
@click.option("--image", default=None, help="Container image (default: a PyTorch image of the provider's).")
@click.option("--token-env", default=None, help="Variable holding the API key (default "
              f"{' / '.join(PROVIDERS[name].token_env for name in RENTABLE)}).")
@click.option("--api-url", default=None, help="The provider's API (default: its own): a proxy, or a stand-in.")
@click.option("--key", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="SSH key to log in with (default: orch's own, made in ORCH_HOME/ssh the first time).")
@click.option("--root", default=None, help="Where orch keeps its files on the instance (RunPod: /workspace/orch).")
@click.option("--python", "python", default="python3", show_default=True, help="The instance's python.")
@click.option("--user", default="root", show_default=True, help="The login user of the image.")
@click.option("-y", "--yes", is_flag=True, help="Rent without asking (scripts).")
@pass_app
def rent_cmd(app: App, name: str, provider: str, gpu: str, count: int, max_price: float | None, disk_gb: int,
             min_reliability: float | None, image: str | None, token_env: str | None, api_url: str | None,
             key: Path | None, root: str | None, python: str, user: str, yes: bool) -> None:
    """Rent a GPU instance on vast.ai or RunPod: search offers, show the best one and its price,
    create it after a yes (or --yes), wait until SSH answers, and add it as a host.

    The entry keeps the provider, the instance id, the token variable's NAME and --api-url,
    never the token. Creation is sent once, never retried. `orch down`/`up` stop and start it,
    `orch release` destroys it.

    \b
    Examples:
      export VAST_API_KEY=...
      orch rent g1 --provider vast --gpu RTX_4090 --max-price 0.5 --disk 60
      orch rent g2 --provider runpod --gpu "RTX 4090" --count 2 --yes
    """
    facts = PROVIDERS[provider]  # its token variable, image, root and presets (providers/registry.py)
    token_env = token_env or facts.token_env
    if not ENV_KEY_RE.match(token_env):
        raise UsageError(f"--token-env wants a variable NAME (like {facts.token_env}), got {token_env!r}")
    if name == LOCAL or (app.inventory.dir / f"{name}.json").is_file():
        raise UsageError(f"a host named {name} exists already: choose another name (orch hosts ls)")
    try:
        draft = Host(name=name, root=root or facts.root or DEFAULT_ROOT, python=python, user=user,
                     presets=facts.presets,
                     provider=ProviderRef(name=provider, instance="new", token_env=token_env,  # type: ignore[arg-type]
                                          api_url=api_url))
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error.get("loc", ()))
        raise UsageError(f"invalid {where}: {str(error['msg']).removeprefix('Value error, ')}") from None
    market = open_named(provider, token_env, api_url)
    wanted = Wanted(gpu=gpu, count=count, max_price=max_price, disk_gb=disk_gb, min_reliability=min_reliability)
    offers = market.search(wanted)
    if not offers:
        raise ProviderError(provider, "search", f"no offer of {count}x {gpu}" +
                            (f" under {max_price:g} {facts.currency}/h" if max_price is not None else "") +
                            f" with {disk_gb} GB of disk matches now: try another GPU, price or disk")
    best = offers[0]
    app.say(f"best of {len(offers)} matching offer{'s' if len(offers) != 1 else ''}: {provider} offer {best.id}: "
            f"{best.describe()}")
    answer = yes or confirm(f"Rent it as {name} at {best.price_per_hour:.3g} {best.currency}/h (billing starts "
                            "now)?", default=False)
    if answer is None:
        raise UsageError("renting starts billing; to rent it: " + _command(name, provider, gpu, count, max_price,
                                                                           disk_gb, min_reliability, image,
                                                                           token_env, api_url, key, root, python,
                                                                           user))
    if not answer:
        raise UsageError("nothing was rented")
    private, public_line = keys.orch_key(key, app.say)
    label = f"orch-{name}"
    assert facts.image is not None  # --provider is one of RENTABLE: each has an image
    instance = market.create(best, image or facts.image, disk_gb, label, public_line)
    assert draft.provider is not None
    host = draft.model_copy(update={"provider": draft.provider.model_copy(update={"instance": instance}),
                                    "identity_file": str(private), "price_per_hour": best.price_per_hour})
    app.inventory.save(host)
    app.say(f"{name}: rented {provider} instance {instance} at {best.price_per_hour:.3g} {best.currency}/h; "
            "waiting until SSH answers")
    try:
        market.authorize_key(instance, public_line)
        live = bring_up(host, app.say, login(app.inventory, app.say, trust=True))
    except BaseException:
        app.say(f"{name}: {provider} instance {instance} is rented and billing: `orch up {name}` waits for it "
                f"again, `orch release {name}` destroys it")
        raise
    remember_price(app.inventory, host)
    app.say(f"{name}: up, SSH answers at {live.user}@{live.address}:{live.port}; `orch down {name}` stops it, "
            f"`orch release {name}` destroys it")


def _command(name: str, provider: str, gpu: str, count: int, max_price: float | None, disk_gb: int,
             min_reliability: float | None, image: str | None, token_env: str, api_url: str | None,
             key: Path | None, root: str | None, python: str, user: str) -> str:
    """The ``orch rent ... --yes`` line that rents what this one showed."""
    argv = ["orch", "rent", name, "--provider", provider, "--gpu", gpu]
    argv += ["--count", str(count)] if count != 1 else []
    argv += ["--max-price", f"{max_price:g}"] if max_price is not None else []
    argv += ["--disk", str(disk_gb)] if disk_gb != 40 else []
    argv += ["--min-reliability", f"{min_reliability:g}"] if min_reliability is not None else []
    argv += ["--image", image] if image else []
    argv += ["--token-env", token_env] if token_env != PROVIDERS[provider].token_env else []
    argv += ["--api-url", api_url] if api_url else []
    argv += ["--key", str(key)] if key else []
    argv += ["--root", root] if root else []
    argv += ["--python", python] if python != "python3" else []
    argv += ["--user", user] if user != "root" else []
    return shlex.join([*argv, "--yes"])


COMMANDS = [rent_cmd]
