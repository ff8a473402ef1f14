"""UCI Online Retail CSV (Chen, Sain and Guo 2012; CC BY 4.0): a year of a UK gift retailer's
invoices, one row per invoice line:
``InvoiceNo,StockCode,Description,Quantity,InvoiceDate,UnitPrice,CustomerID,Country``.

Mapping (the actions and node types come from `configs/online_retail.toml`):
- customer -> ``user:<id>`` (the float ``17850.0`` becomes ``17850``);
- stock code -> ``product:<CODE>`` (upper-cased: ``85123a`` and ``85123A`` are one product);
  its description is the product's entity text, sent when the product is first seen and
  again whenever the description changes;
- an invoice line -> ``purchase`` (deep funnel), weight ``log2(1 + quantity)`` clipped to
  [1, 8], so a wholesaler's 12,000 units weigh 8 times one unit, not 12,000 times;
- a cancellation (``C`` invoice, negative quantity) -> ``cancel`` (negative feedback) with
  the same weight rule on ``|quantity|``;
- the customer's country -> a structural ``lives_in`` edge to ``country:<Name_With_Underscores>``, sent when
  the customer is first seen (and again if the country changes).

Rows that cannot become events are skipped and counted by reason in `Rejects` (the file
replay reports them; none reaches state): no customer, non-product codes (postage,
manual adjustments, bank charges, fees, gift vouchers, ...), empty descriptions, zero
quantity or price, unreadable numbers or dates. Invoice dates are UK local time.
"""
from __future__ import annotations

import csv
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Iterable, Iterator
from zoneinfo import ZoneInfo

from hirflow.state.events import Engagement, Entity

HEADER = ("InvoiceNo", "StockCode", "Description", "Quantity", "InvoiceDate", "UnitPrice",
          "CustomerID", "Country")
PRODUCT_CODE = re.compile(r"^\d{5}[A-Z]{0,3}$")     # 85123A; POST, DOT, M, C2, gift_0001_20 are not
UK = ZoneInfo("Europe/London")
MAX_WEIGHT = 8.0


class OnlineRetailFormatError(ValueError):
    pass


@dataclass
class Rejects:
    """Rows skipped, by reason, and the first few examples of each (line number, reason)."""
    counts: Counter = field(default_factory=Counter)
    examples: list[tuple[int, str]] = field(default_factory=list)

    def add(self, lineno: int, reason: str) -> None:
        self.counts[reason] += 1
        if self.counts[reason] <= 3:
            self.examples.append((lineno, reason))

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def looks_like(first_line: str) -> bool:
    return tuple(c.strip() for c in first_line.strip().split(",")) == HEADER


def quantity_weight(quantity: float) -> float:
    """log2(1 + |quantity|) clipped to [1, MAX_WEIGHT]."""
    return min(MAX_WEIGHT, max(1.0, math.log2(1.0 + abs(quantity))))


def _ts(text: str) -> int:
    """'2010-12-01 08:26:00' (or '12/1/2010 8:26', the UCI spreadsheet's form), UK time -> ms."""
    for fmt in ("%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M", "%m/%d/%Y %H:%M"):
        try:
            return int(datetime.strptime(text, fmt).replace(tzinfo=UK).timestamp() * 1000)
        except ValueError:
            continue
    raise ValueError(text)


def _key(name: str) -> str:
    """'United Kingdom' -> 'United_Kingdom' (node keys have no spaces or colons)."""
    return re.sub(r"[\s:]+", "_", name)


def read(lines: Iterable[str], rejects: Rejects | None = None) -> Iterator[Engagement | Entity]:
    """Events of the file's rows in file order (the file is in invoice-time order); rows that
    are not purchases or cancellations of a product by a customer go to `rejects`."""
    rejects = rejects if rejects is not None else Rejects()
    reader = csv.reader(lines)
    head = next(reader, None)
    if head is None or tuple(c.strip() for c in head) != HEADER:
        raise OnlineRetailFormatError(f"line 1: expected the header {','.join(HEADER)}, got {head}")
    described: dict[str, str] = {}       # product -> description last sent
    country_of: dict[str, str] = {}      # user -> country last sent
    for lineno, row in enumerate(reader, 2):
        if not row:                      # a blank line is no row
            continue
        if len(row) != len(HEADER):
            rejects.add(lineno, "wrong_column_count")
            continue
        invoice, code, desc, qty, date, price, customer, country = (c.strip() for c in row)
        if not customer:
            rejects.add(lineno, "no_customer")
            continue
        code = code.upper()
        if not PRODUCT_CODE.match(code):
            rejects.add(lineno, "not_a_product")
            continue
        if not desc:
            rejects.add(lineno, "empty_description")
            continue
        try:
            q, p, t = float(qty), float(price), _ts(date)
            user = f"user:{int(float(customer))}"
        except ValueError:
            rejects.add(lineno, "unreadable_number_or_date")
            continue
        if not (math.isfinite(q) and math.isfinite(p)) or q == 0 or p <= 0:
            rejects.add(lineno, "zero_quantity_or_price")
            continue
        cancelled = invoice.upper().startswith("C") or q < 0
        product = f"product:{code}"
        if described.get(product) != desc:
            described[product] = desc
            yield Entity(product, t, text=desc)
        if country and country_of.get(user) != country:
            country_of[user] = country
            yield Engagement(user, f"country:{_key(country)}", "lives_in", t)
        yield Engagement(user, product, "cancel" if cancelled else "purchase", t, w=quantity_weight(q),
                         id=f"{invoice}:{lineno}")
