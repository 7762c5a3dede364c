"""Travel booking: search flights, book the cheapest one that fits, add a bag, choose a seat.

Scripted solution: ``TravelBookingEnv(...).solution_calls()`` after ``reset(seed)`` (``solution()``
writes it as text). Each call that completes a request ends its result with the next one
(``ToolUseBaseEnv``'s notice); ``<answer>done</answer>`` ends the episode after the last.
"""

import json
import random


def _schema(properties, required=()):
    return {"type": "object", "properties": properties, "required": list(required)}


class TravelBookingEnv(ToolUseBaseEnv):
    def reset(self, seed=None):
        rng = random.Random(seed)
        self.turn_count = 0
        self._call_history = []
        origin, dest = rng.sample(["LIS", "OSL", "ATH", "DUB", "VIE"], 2)
        flights = {}
        for n in range(4):
            flights[f"F{n + 1}{rng.randint(10, 99)}"] = {"from": origin, "to": dest, "price": rng.randint(80, 400),
                                                         "stops": rng.choice([0, 1])}
        self._state = {"flights": flights, "booking": None, "bags": 0, "seat": None}
        cheapest = min((f for f in flights if flights[f]["stops"] == 0), key=lambda f: flights[f]["price"],
                       default=min(flights, key=lambda f: flights[f]["price"]))
        self._target = cheapest
        self._tools = {
            "search_flights": {"description": "Flights between two airports (IATA codes).",
                               "parameters": _schema({"origin": {"type": "string"}, "destination": {"type": "string"},
                                                      "max_stops": {"type": "integer", "enum": [0, 1]}},
                                                     ["origin", "destination"])},
            "book_flight": {"description": "Book a flight by id.",
                            "parameters": _schema({"flight_id": {"type": "string"}}, ["flight_id"])},
            "add_bag": {"description": "Add checked bags to the booking.",
                        "parameters": _schema({"count": {"type": "integer"}}, ["count"])},
            "choose_seat": {"description": "Choose a seat type on the booking.",
                            "parameters": _schema({"kind": {"type": "string", "enum": ["window", "aisle", "middle"]}},
                                                  ["kind"])},
            "convert_currency": {"description": "Convert an amount between currencies.",
                                 "parameters": _schema({"amount": {"type": "number"}, "to": {"type": "string"}},
                                                       ["amount", "to"])},
        }
        self._user_messages = [
            f"Book me the cheapest nonstop flight from {origin} to {dest} (if none is nonstop, the cheapest).",
            "Add one checked bag.",
            "And I'd like a window seat.",
        ]
        self._message_criteria = [
            lambda s: s["booking"] == self._target,
            lambda s: s["booking"] is not None and s["bags"] == 1,
            lambda s: s["seat"] == "window",
        ]
        self._current_msg = 0
        self._route = (origin, dest)
        return self._user_messages[0], {}

    def tool_search_flights(self, origin, destination, max_stops=1):
        rows = [f"{fid}: {f['price']} EUR, {f['stops']} stop(s)" for fid, f in self._state["flights"].items()
                if f["from"] == origin and f["to"] == destination and f["stops"] <= max_stops]
        return "\n".join(rows) or "no flights"

    def tool_book_flight(self, flight_id):
        if flight_id not in self._state["flights"]:
            return f"unknown flight {flight_id}"
        self._state["booking"] = flight_id
        return f"booked {flight_id}"

    def tool_add_bag(self, count):
        if self._state["booking"] is None:
            return "book a flight first"
        self._state["bags"] += int(count)
        return f"{self._state['bags']} bag(s) on the booking"

    def tool_choose_seat(self, kind):
        if self._state["booking"] is None:
            return "book a flight first"
        self._state["seat"] = kind
        return f"{kind} seat chosen"

    def tool_convert_currency(self, amount, to):
        return f"{float(amount) * 1.1:.2f} {to}"

    def solution_calls(self):
        origin, dest = self._route
        return [("search_flights", {"origin": origin, "destination": dest}),
                ("book_flight", {"flight_id": self._target}), ("add_bag", {"count": 1}),
                ("choose_seat", {"kind": "window"})]

    def solution(self):
        """The tool calls of ``solution_calls()`` in order, then the final answer."""
        calls = [f"{name}({json.dumps(arguments)})" for name, arguments in self.solution_calls()]
        return " -> ".join(calls + ["<answer>done</answer>"])
