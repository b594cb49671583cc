"""An agent whose *idempotency key itself* comes from the model's reply.

The model invents a payment reference that depends on how often it was asked
(``n``, counted across processes in ``$CAIRN_PAYMENTS_ASKS``), and the
``pay`` tool sends that reference as the bank's idempotency key. If a
recovered run asked the model again, it would get a new reference, the bank
would see a key it never saw, and the supplier would be paid twice: the
bank's deduplication cannot help. What prevents it is that ``ctx.model`` is
journaled: recovery replays the recorded reply, so the tool is called with
the very same reference, and reconciliation finds the transfer by it.

``pay_invoice_unjournaled`` is the same agent asking the model *outside* the
journal (a plain ``MODEL.complete``): the shape of the engine-bug test.
"""

from __future__ import annotations

import json
import os

import cairn
from cairn.demo.bank import BankClient, Transfer
from cairn.demo.payments import ASKS_ENV, BANK_URL_ENV, CountedModel
from cairn.models import Message, ModelRequest, ToolCall

app = cairn.App()

WORKFLOW = "pay-invoice"
UNJOURNALED = "pay-invoice-unjournaled"
PAYER = "acct_cairn_shop"


def invoice_policy(request: ModelRequest, n: int) -> Message:
    invoice = json.loads(request.messages[-1].content or "{}")
    arguments = {
        "reference": f"{invoice['invoice_id']}-pay-{n}",  # the idempotency suffix depends on n
        "to": invoice["supplier_account"],
        "amount_cents": invoice["amount_cents"],
        "memo": f"Invoice {invoice['invoice_id']} (decision #{n})",
    }
    return Message(role="assistant", content="Paying the invoice.",
                   tool_calls=(ToolCall(id=f"call_{n}", name="pay", arguments=json.dumps(arguments)),))


MODEL = CountedModel(invoice_policy, model_id="scripted-invoices-1", asks_env=ASKS_ENV)


def invoice_request(invoice_id: str, supplier_account: str, amount_cents: int) -> list[Message]:
    invoice = {"invoice_id": invoice_id, "supplier_account": supplier_account, "amount_cents": amount_cents}
    return [Message(role="user", content=json.dumps(invoice))]


def bank() -> BankClient:
    return BankClient(os.environ[BANK_URL_ENV])


def find_payment(op: cairn.Operation) -> cairn.Done[Transfer] | cairn.NotFound:
    """Look the payment up by the reference the model chose (as recorded in
    the operation's arguments)."""
    found = bank().transfer_by_key(str(op.arguments["reference"]))
    return cairn.Done(found) if found is not None else cairn.NotFound()


def _pay(op: cairn.Operation, reference: str, to: str, amount_cents: int, memo: str) -> Transfer:
    return bank().create_transfer(idempotency_key=reference, from_account=PAYER, to_account=to,
                                  amount_cents=amount_cents, memo=memo)


pay: cairn.Tool[[str, str, int, str], Transfer] = app.tool(effect="write", name="pay",
                                                          reconcile=find_payment)(_pay)


def _pay_with(reply: Message) -> Transfer:
    arguments = reply.tool_calls[0].parsed_arguments()
    return pay(str(arguments["reference"]), str(arguments["to"]), int(arguments["amount_cents"]),
               str(arguments["memo"]))


def _pay_invoice(ctx: cairn.Context, invoice_id: str, supplier_account: str, amount_cents: int) -> Transfer:
    reply = ctx.model(MODEL, invoice_request(invoice_id, supplier_account, amount_cents))
    return _pay_with(reply.message)


def _pay_invoice_unjournaled(
    ctx: cairn.Context, invoice_id: str, supplier_account: str, amount_cents: int
) -> Transfer:
    # Wrong on purpose: the decision is not journaled, so a recovered run asks again.
    reply = MODEL.complete(ModelRequest(tuple(invoice_request(invoice_id, supplier_account, amount_cents))))
    return _pay_with(reply.message)


def register(target: cairn.App) -> cairn.App:
    target.workflow(name=WORKFLOW)(_pay_invoice)
    target.workflow(name=UNJOURNALED)(_pay_invoice_unjournaled)
    return target


register(app)
