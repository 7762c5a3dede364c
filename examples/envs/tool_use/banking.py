"""Banking: check balances, move money between own accounts, pay a saved payee, and decline an
unrelated request through ``decline_request``.

Scripted solution: ``BankingEnv(...).solution_calls()`` after ``reset(seed)`` (``solution()``
writes it as text). Each call that completes a request ends its result with the next one
(``ToolUseBaseEnv``'s notice); ``<answer>done</answer>`` ends the episode after the last.
"""

import json
import random


def _schema(properties, required=()):
    return {"type": "object", "properties": properties, "required": list(required)}


class BankingEnv(ToolUseBaseEnv):
    def reset(self, seed=None):
        rng = random.Random(seed)
        self.turn_count = 0
        self._call_history = []
        self._state = {"accounts": {"checking": rng.randint(700, 900), "savings": rng.randint(1000, 5000)},
                       "payees": {"landlord": "IBAN-77", "power co": "IBAN-12"}, "payments": [], "declined": []}
        self._move = rng.choice([100, 150, 250])
        self._rent = rng.randint(400, 700)
        self._tools = {
            "get_balance": {"description": "Balance of one account.",
                            "parameters": _schema({"account": {"type": "string", "enum": ["checking", "savings"]}},
                                                  ["account"])},
            "transfer": {"description": "Move money between the customer's own accounts.",
                         "parameters": _schema({"source": {"type": "string", "enum": ["checking", "savings"]},
                                                "target": {"type": "string", "enum": ["checking", "savings"]},
                                                "amount": {"type": "integer"}}, ["source", "target", "amount"])},
            "pay": {"description": "Pay a saved payee from checking.",
                    "parameters": _schema({"payee": {"type": "string"}, "amount": {"type": "integer"}},
                                          ["payee", "amount"])},
            "decline_request": {"description": "Decline a request that this assistant cannot serve.",
                                "parameters": _schema({"reason": {"type": "string"}}, ["reason"])},
            "stock_quote": {"description": "Latest price of a stock ticker.",
                            "parameters": _schema({"ticker": {"type": "string"}}, ["ticker"])},
        }
        self._user_messages = [
            f"Move {self._move} from savings to checking.",
            f"Then pay my landlord {self._rent}.",
            "Also, can you book me a table for two at an Italian restaurant tonight?",
        ]
        start = dict(self._state["accounts"])
        self._message_criteria = [
            lambda s: s["accounts"]["savings"] == start["savings"] - self._move,
            lambda s: any(p == ("landlord", self._rent) for p in s["payments"]),
            lambda s: len(s["declined"]) > 0,
        ]
        self._current_msg = 0
        return self._user_messages[0], {}

    def tool_get_balance(self, account):
        return f"{account}: {self._state['accounts'][account]}"

    def tool_transfer(self, source, target, amount):
        accounts = self._state["accounts"]
        amount = int(amount)
        if source == target or amount <= 0 or accounts[source] < amount:
            return "transfer refused"
        accounts[source] -= amount
        accounts[target] += amount
        return f"moved {amount} from {source} to {target}"

    def tool_pay(self, payee, amount):
        amount = int(amount)
        if payee not in self._state["payees"]:
            return f"{payee} is not a saved payee"
        if self._state["accounts"]["checking"] < amount:
            return "insufficient funds in checking"
        self._state["accounts"]["checking"] -= amount
        self._state["payments"].append((payee, amount))
        return f"paid {amount} to {payee}"

    def tool_decline_request(self, reason):
        self._state["declined"].append(reason)
        return "declined"

    def tool_stock_quote(self, ticker):
        return f"{ticker}: 101.5"

    def solution_calls(self):
        return [("transfer", {"source": "savings", "target": "checking", "amount": self._move}),
                ("get_balance", {"account": "checking"}), ("pay", {"payee": "landlord", "amount": self._rent}),
                ("decline_request", {"reason": "restaurant bookings are outside banking"})]

    def solution(self):
        """The tool calls of ``solution_calls()`` in order, then the final answer."""
        calls = [f"{name}({json.dumps(arguments)})" for name, arguments in self.solution_calls()]
        return " -> ".join(calls + ["<answer>done</answer>"])
