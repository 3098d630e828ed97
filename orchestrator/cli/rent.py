"""``orch rent``: rent an instance and add it as a host: a marketplace's best offer (vast.ai,
RunPod), or a provider's named GPU specification (AutoDL Pro: ``RentsBySpec``)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import click
from click.core import ParameterSource
from pydantic import ValidationError

from orchestrator.access import keys
from orchestrator.access.power import login, remember_price
from orchestrator.access.provisioned import bring_up
from orchestrator.ask import confirm
from orchestrator.cli.app import App, pass_app
from orchestrator.errors import UsageError
from orchestrator.hosts.inventory import DEFAULT_ROOT, LOCAL, Host, ProviderRef
from orchestrator.providers.api import Provider, ProviderError, Wanted
from orchestrator.providers.open import open_named
from orchestrator.providers.registry import PROVIDERS, RENTABLE
from orchestrator.spec.model import ENV_KEY_RE


@click.command("rent")
@click.argument("name")
@click.option("--provider", type=click.Choice(RENTABLE), required=True, help="The provider.")
@click.option("--gpu", required=True, help="GPU type, e.g. RTX_4090, \"A100 80GB\" (matched loosely; AutoDL: a Pro "
              "specification such as 4090D or 5090-p).")
@click.option("--count", type=click.IntRange(1, 16), default=1, show_default=True, help="GPUs in the instance.")
@click.option("--max-price", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Most USD per hour for the whole instance.")
@click.option("--disk", "disk_gb", type=click.IntRange(5, 10000), default=40, show_default=True,
              help="Disk in GB (RunPod: the volume at /workspace, kept while stopped; AutoDL: the system disk's "
              "expansion, 0 unless given).")
@click.option("--min-reliability", type=click.FloatRange(0, 1), default=None,
              help="Least reliability an offer may have (vast: 0.95 unless given).")
@click.option("--image", default=None, help="Container image (default: a PyTorch image of the provider's; AutoDL: a "
              "base image's uuid or tag, or one of your saved images).")
@click.option("--region", default=None, help="AutoDL: data centers to rent in, comma-separated codes or names "
              "(default: AutoDL chooses).")
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
             min_reliability: float | None, image: str | None, region: str | None, token_env: str | None,
             api_url: str | None, key: Path | None, root: str | None, python: str, user: str, yes: bool) -> None:
    """Rent a GPU instance on vast.ai or RunPod (search offers, show the best one and its price)
    or an AutoDL Pro instance (the GPU specification, image and region you name), create it after
    a yes (or --yes), wait until SSH answers, and add it as a host.

    The entry keeps the provider, the instance id, the token variable's NAME and --api-url,
    never the token. Creation is sent once, never retried. `orch down`/`up` stop and start it,
    `orch release` destroys it.

    \b
    Examples:
      export VAST_API_KEY=...
      orch rent g1 --provider vast --gpu RTX_4090 --max-price 0.5 --disk 60
      orch rent g2 --provider runpod --gpu "RTX 4090" --count 2 --yes
      orch rent a1 --provider autodl --gpu 4090D --region westDC3 --yes
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
    if isinstance(market, RentsBySpec):
        given = click.get_current_context().get_parameter_source("disk_gb") != ParameterSource.DEFAULT
        assert facts.image is not None  # --provider is one of RENTABLE: each has an image
        command = _command(name, provider, gpu, count, max_price, disk_gb, min_reliability, image, token_env,
                           api_url, key, root, python, user, region)
        return _rent_spec(app, market, draft, gpu, count, max_price, disk_gb if given else 0, min_reliability,
                          image or facts.image, region, key, yes, command)
    if region:
        raise UsageError(f"--region is for a provider that rents by specification; {provider} rents offers: "
                         "its search finds where")
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
                                                                           user, region))
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
    except BaseException:
        app.say(f"{name}: {provider} instance {instance} is rented and billing: `orch up {name}` waits for it "
                f"again, `orch release {name}` destroys it")
        raise
    _up(app, host, market, instance)


class SpecOrder(Protocol):
    """What a ``RentsBySpec`` provider will rent, every word resolved."""

    def describe(self) -> str: ...


@runtime_checkable
class RentsBySpec(Protocol):
    """A provider that rents a named GPU specification rather than a marketplace offer
    (``providers/autodl.py``): ``order`` turns the user's words into what ``create_order``
    sends (exit 2 naming what exists), the price known only once the instance exists."""

    def order(self, gpu: str, count: int, image: str, region: str | None, disk_gb: int) -> SpecOrder: ...

    def create_order(self, order: Any, label: str) -> str: ...


def _rent_spec(app: App, provider: Provider, draft: Host, gpu: str, count: int, max_price: float | None,
               disk_gb: int, min_reliability: float | None, image: str, region: str | None,
               key: Path | None, yes: bool, command: str) -> None:
    """``orch rent`` for a ``RentsBySpec`` provider: the order shown, created once after a yes,
    the entry saved, then up as a marketplace instance is (the host key pinned, the price kept).
    The box logs in with the password its provider hands out, or ``--key`` where given."""
    assert isinstance(provider, RentsBySpec) and draft.provider is not None
    if max_price is not None or min_reliability is not None:
        raise UsageError(f"{provider.name} takes no --max-price or --min-reliability: it rents the specification "
                         "you name at its own price, shown once the instance exists")
    order = provider.order(gpu, count, image, region, disk_gb)
    app.say(f"{provider.name} Pro instance: {order.describe()}; pay as you go, at {provider.name}'s price "
            "(known once it exists)")
    answer = yes or confirm(f"Rent it as {draft.name} (billing starts once it runs)?", default=False)
    if answer is None:
        raise UsageError("renting starts billing; to rent it: " + command)
    if not answer:
        raise UsageError("nothing was rented")
    instance = provider.create_order(order, f"orch-{draft.name}")
    host = draft.model_copy(update={"provider": draft.provider.model_copy(update={"instance": instance}),
                                    "identity_file": str(key) if key else None})
    app.inventory.save(host)
    app.say(f"{draft.name}: rented {provider.name} instance {instance}; waiting until SSH answers")
    _up(app, host, provider, instance)


def _up(app: App, host: Host, provider: Provider, instance: str) -> None:
    """Wait until the rented instance answers SSH (its host key pinned), keep its price, say so;
    on any failure say that it is rented and billing and how to go on."""
    try:
        live = bring_up(host, app.say, login(app.inventory, app.say, trust=True))
    except BaseException:
        app.say(f"{host.name}: {provider.name} instance {instance} is rented and billing: `orch up {host.name}` "
                f"waits for it again, `orch release {host.name}` destroys it")
        raise
    remember_price(app.inventory, host)
    app.say(f"{host.name}: up, SSH answers at {live.user}@{live.address}:{live.port}; `orch down {host.name}` stops "
            f"it, `orch release {host.name}` destroys it")


def _command(name: str, provider: str, gpu: str, count: int, max_price: float | None, disk_gb: int,
             min_reliability: float | None, image: str | None, token_env: str, api_url: str | None,
             key: Path | None, root: str | None, python: str, user: str, region: str | None = None) -> str:
    """The ``orch rent ... --yes`` line that rents what this one showed."""
    argv = ["orch", "rent", name, "--provider", provider, "--gpu", gpu]
    argv += ["--count", str(count)] if count != 1 else []
    argv += ["--max-price", f"{max_price:g}"] if max_price is not None else []
    argv += ["--disk", str(disk_gb)] if disk_gb != 40 else []
    argv += ["--min-reliability", f"{min_reliability:g}"] if min_reliability is not None else []
    argv += ["--image", image] if image else []
    argv += ["--region", region] if region else []
    argv += ["--token-env", token_env] if token_env != PROVIDERS[provider].token_env else []
    argv += ["--api-url", api_url] if api_url else []
    argv += ["--key", str(key)] if key else []
    argv += ["--root", root] if root else []
    argv += ["--python", python] if python != "python3" else []
    argv += ["--user", user] if user != "root" else []
    return shlex.join([*argv, "--yes"])


COMMANDS = [rent_cmd]
