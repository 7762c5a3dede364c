"""Support tickets: read the newest open ticket, set its priority, assign it, ask for a missing
order number (the customer never gave one), then close a duplicate.

Scripted solution: ``SupportTicketsEnv(...).solution_calls()`` after ``reset(seed)`` (``solution()``
writes it as text). Each call that completes a request ends its result with the next one
(``ToolUseBaseEnv``'s notice); ``<answer>done</answer>`` ends the episode after the last.
"""

import json
import random


def _schema(properties, required=()):
    return {"type": "object", "properties": properties, "required": list(required)}


class SupportTicketsEnv(ToolUseBaseEnv):
    def reset(self, seed=None):
        rng = random.Random(seed)
        self.turn_count = 0
        self._call_history = []
        subjects = ["login fails", "refund missing", "app crashes", "wrong invoice", "slow delivery"]
        rng.shuffle(subjects)
        tickets = {}
        for n, subject in enumerate(subjects[:4]):
            tickets[f"T{100 + n}"] = {"subject": subject, "status": "open", "priority": "normal",
                                      "assignee": None, "opened": 10 + n * rng.randint(1, 3), "messages": []}
        newest = max(tickets, key=lambda t: tickets[t]["opened"])
        oldest = min(tickets, key=lambda t: tickets[t]["opened"])
        self._newest, self._oldest = newest, oldest
        self._agent = rng.choice(["kim", "lee", "sam"])
        self._state = {"tickets": tickets, "agents": ["kim", "lee", "sam"]}
        self._tools = {
            "list_tickets": {"description": "Open tickets with their opening time.",
                             "parameters": _schema({"status": {"type": "string", "enum": ["open", "closed"]}},
                                                   ["status"])},
            "update_ticket": {"description": "Change a ticket's priority, assignee or status.",
                              "parameters": _schema({"ticket_id": {"type": "string"},
                                                     "priority": {"type": "string", "enum": ["low", "normal", "high"]},
                                                     "assignee": {"type": "string"},
                                                     "status": {"type": "string", "enum": ["open", "closed"]}},
                                                    ["ticket_id"])},
            "message_customer": {"description": "Send a message to the ticket's customer.",
                                 "parameters": _schema({"ticket_id": {"type": "string"}, "text": {"type": "string"}},
                                                       ["ticket_id", "text"])},
            "translate": {"description": "Translate text into another language.",
                          "parameters": _schema({"text": {"type": "string"}, "language": {"type": "string"}},
                                                ["text", "language"])},
        }
        self._user_messages = [
            "Find the most recently opened ticket and make it high priority.",
            f"Assign that ticket to {self._agent}.",
            "Its customer didn't give an order number: ask them for it.",
            "The oldest open ticket is a duplicate: close it.",
        ]
        self._message_criteria = [
            lambda s: s["tickets"][newest]["priority"] == "high",
            lambda s: s["tickets"][newest]["assignee"] == self._agent,
            lambda s: any("order" in m.lower() for m in s["tickets"][newest]["messages"]),
            lambda s: s["tickets"][oldest]["status"] == "closed",
        ]
        self._current_msg = 0
        return self._user_messages[0], {}

    def tool_list_tickets(self, status):
        return "\n".join(f"{t}: {v['subject']} (opened at {v['opened']}, {v['priority']})"
                         for t, v in self._state["tickets"].items() if v["status"] == status) or "none"

    def tool_update_ticket(self, ticket_id, priority=None, assignee=None, status=None):
        ticket = self._state["tickets"][ticket_id]
        if assignee is not None and assignee not in self._state["agents"]:
            return f"no agent {assignee}"
        for key, value in (("priority", priority), ("assignee", assignee), ("status", status)):
            if value is not None:
                ticket[key] = value
        return f"{ticket_id} updated"

    def tool_message_customer(self, ticket_id, text):
        self._state["tickets"][ticket_id]["messages"].append(text)
        return "message sent"

    def tool_translate(self, text, language):
        return f"[{language}] {text}"

    def solution_calls(self):
        t = self._newest
        return [("list_tickets", {"status": "open"}), ("update_ticket", {"ticket_id": t, "priority": "high"}),
                ("update_ticket", {"ticket_id": t, "assignee": self._agent}),
                ("message_customer", {"ticket_id": t, "text": "Could you send us your order number?"}),
                ("update_ticket", {"ticket_id": self._oldest, "status": "closed"})]

    def solution(self):
        """The tool calls of ``solution_calls()`` in order, then the final answer."""
        calls = [f"{name}({json.dumps(arguments)})" for name, arguments in self.solution_calls()]
        return " -> ".join(calls + ["<answer>done</answer>"])
