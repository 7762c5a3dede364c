"""Retail orders: look up a customer's order, change its shipping, cancel one item, log a note.

Scripted solution: ``RetailOrdersEnv(...).solution_calls()`` after ``reset(seed)`` (``solution()``
writes it as text). Each call that completes a request ends its result with the next one
(``ToolUseBaseEnv``'s notice); ``<answer>done</answer>`` ends the episode after the last.
"""

import json
import random


def _schema(properties, required=()):
    return {"type": "object", "properties": properties, "required": list(required)}


class RetailOrdersEnv(ToolUseBaseEnv):
    def reset(self, seed=None):
        rng = random.Random(seed)
        self.turn_count = 0
        self._call_history = []
        customer = rng.choice(["Ana Ruiz", "Ben Okafor", "Chloe Marsh", "Dev Patel"])
        order_id = f"O{rng.randint(1000, 9999)}"
        items = rng.sample(["kettle", "lamp", "blender", "toaster", "mug set"], 3)
        self._state = {
            "customers": {customer: [order_id], "Zed Quill": ["O0001"]},
            "orders": {order_id: {"items": list(items), "shipping": "standard", "notes": []},
                       "O0001": {"items": ["pan"], "shipping": "standard", "notes": []}},
        }
        self._drop = items[rng.randrange(3)]
        self._tools = {
            "find_orders": {"description": "List the order ids of a customer.",
                            "parameters": _schema({"customer": {"type": "string"}}, ["customer"])},
            "get_order": {"description": "Show an order's items and shipping speed.",
                          "parameters": _schema({"order_id": {"type": "string"}}, ["order_id"])},
            "set_shipping": {"description": "Change an order's shipping speed.",
                             "parameters": _schema({"order_id": {"type": "string"},
                                                    "speed": {"type": "string",
                                                              "enum": ["standard", "express", "overnight"]}},
                                                   ["order_id", "speed"])},
            "remove_item": {"description": "Remove one item from an order.",
                            "parameters": _schema({"order_id": {"type": "string"}, "item": {"type": "string"}},
                                                  ["order_id", "item"])},
            "add_note": {"description": "Attach a note to an order.",
                         "parameters": _schema({"order_id": {"type": "string"}, "text": {"type": "string"}},
                                               ["order_id", "text"])},
            "get_weather": {"description": "Weather forecast for a city (unrelated to orders).",
                            "parameters": _schema({"city": {"type": "string"}}, ["city"])},
        }
        self._user_messages = [
            f"Hi, I'm {customer}. Please upgrade my order to express shipping.",
            f"Actually, take the {self._drop} out of that order.",
            "Add a note to the order saying 'gift wrap'.",
        ]
        self._message_criteria = [
            lambda s: s["orders"][order_id]["shipping"] == "express",
            lambda s: self._drop not in s["orders"][order_id]["items"],
            lambda s: any("gift wrap" in n.lower() for n in s["orders"][order_id]["notes"]),
        ]
        self._current_msg = 0
        self._expected_answer = "done"
        self._order_id, self._customer = order_id, customer
        return self._user_messages[0], {}

    def _order(self, order_id):
        if order_id not in self._state["orders"]:
            raise KeyError(f"no order {order_id}")
        return self._state["orders"][order_id]

    def tool_find_orders(self, customer):
        return ", ".join(self._state["customers"].get(customer, [])) or "no orders"

    def tool_get_order(self, order_id):
        order = self._order(order_id)
        return f"items: {', '.join(order['items'])}; shipping: {order['shipping']}"

    def tool_set_shipping(self, order_id, speed):
        if speed not in ("standard", "express", "overnight"):
            return f"unknown speed {speed}"
        self._order(order_id)["shipping"] = speed
        return f"{order_id} now ships {speed}"

    def tool_remove_item(self, order_id, item):
        order = self._order(order_id)
        if item not in order["items"]:
            return f"{item} is not in {order_id}"
        order["items"].remove(item)
        return f"removed {item} from {order_id}"

    def tool_add_note(self, order_id, text):
        self._order(order_id)["notes"].append(text)
        return "note added"

    def tool_get_weather(self, city):
        return f"{city}: mild, light wind"

    def solution_calls(self):
        o = self._order_id
        return [("find_orders", {"customer": self._customer}), ("set_shipping", {"order_id": o, "speed": "express"}),
                ("get_order", {"order_id": o}), ("remove_item", {"order_id": o, "item": self._drop}),
                ("add_note", {"order_id": o, "text": "gift wrap"})]

    def solution(self):
        """The tool calls of ``solution_calls()`` in order, then the final answer."""
        calls = [f"{name}({json.dumps(arguments)})" for name, arguments in self.solution_calls()]
        return " -> ".join(calls + ["<answer>done</answer>"])
