// The web chat page: one WebSocket to /chat/ws, every message rendered as text (textContent).
"use strict";

(function () {
  const KEY_ITEM = "statecore.chat.key";
  const NAME_ITEM = "statecore.chat.name";
  const CHAT_ITEM = "statecore.chat.current";
  const $ = (id) => document.getElementById(id);

  // pending: the message last sent, {chat, text, echoed}; it stays in the input until the server
  // echoes it (accepted), and is put back there if the server refuses it.
  const state = {
    ws: null, chats: [], current: null, maxText: 4000, backoff: 250, welcomed: false, pending: null,
  };

  function key() {
    let value = localStorage.getItem(KEY_ITEM);
    if (!value) {
      const bytes = new Uint8Array(24);
      crypto.getRandomValues(bytes);
      value = Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
      localStorage.setItem(KEY_ITEM, value);
    }
    return value;
  }

  function setStatus(text, kind) {
    const status = $("status");
    status.textContent = text;
    status.dataset.state = kind;
  }

  function note(text) {
    const el = $("note");
    el.textContent = text || "";
    el.hidden = !text;
  }

  function send(payload) {
    if (state.ws && state.ws.readyState === WebSocket.OPEN) {
      state.ws.send(JSON.stringify(payload));
      return true;
    }
    note("not connected: the message was not sent");
    return false;
  }

  function connect() {
    const url = new URL("ws", window.location.href);
    url.protocol = window.location.protocol === "https:" ? "wss:" : "ws:";
    const ws = new WebSocket(url.href);
    state.ws = ws;
    ws.addEventListener("open", () => {
      state.backoff = 250;
      setStatus("online", "online");
      const name = localStorage.getItem(NAME_ITEM);
      if (name) {
        send({ type: "hello", key: key(), name: name });
      } else {
        $("join").hidden = false;
        $("name").focus();
      }
    });
    ws.addEventListener("message", (event) => {
      let message;
      try {
        message = JSON.parse(event.data);
      } catch (err) {
        return;
      }
      handle(message);
    });
    ws.addEventListener("close", () => {
      setStatus("offline: reconnecting…", "offline");
      state.welcomed = false;
      state.pending = null;
      setTimeout(connect, state.backoff);
      state.backoff = Math.min(state.backoff * 2, 5000);
    });
  }

  function handle(message) {
    switch (message.type) {
      case "welcome":
        welcome(message);
        break;
      case "history":
        history(message.chat, message.messages);
        break;
      case "message":
        addMessage(message);
        if (!message.bot) {
          accepted(message);
        }
        if (message.bot && message.chat === state.current) {
          $("typing").hidden = true;
        }
        break;
      case "edit":
        editMessage(message);
        break;
      case "typing":
        if (message.chat === state.current) {
          $("typing").textContent = message.status ? "bot is " + message.status + "…" : "";
          $("typing").hidden = !message.status;
        }
        break;
      case "refused":
        refused(message);
        break;
      case "error":
        note("Error: " + message.reason);
        break;
      default:
        break;
    }
  }

  function setText(text) {
    $("text").value = text;
    $("count").textContent = String(text.length);
  }

  function accepted(message) {
    // The person's own message came back: it was taken, the input can be emptied.
    const pending = state.pending;
    if (pending && !pending.echoed && pending.chat === message.chat && pending.text === message.text) {
      pending.echoed = true;
      if ($("text").value === pending.text) {
        setText("");
      }
    }
  }

  function refused(message) {
    // Not sent: what the person wrote stays (or comes back) in the input, to shorten or resend.
    const pending = state.pending;
    if (pending && message.chat === pending.chat) {
      state.pending = null;
      if ($("text").value === "" && pending.chat === state.current) {
        setText(pending.text);
      }
    }
    note("Not sent: " + message.reason);
  }

  function welcome(message) {
    state.welcomed = true;
    state.maxText = message.max_text;
    $("max").textContent = String(message.max_text);
    $("who").textContent = message.name;
    $("join").hidden = true;
    $("app").hidden = false;
    state.chats = [];
    $("chats").replaceChildren();
    for (const chat of message.chats) {
      listChat(chat);
    }
    const wanted = localStorage.getItem(CHAT_ITEM);
    if (message.chats.length === 0) {
      open("general");
    } else {
      select(message.chats.includes(wanted) ? wanted : message.chats[0]);
    }
  }

  function listChat(chat) {
    if (state.chats.includes(chat)) {
      return;
    }
    state.chats.push(chat);
    const li = document.createElement("li");
    li.textContent = "# " + chat;
    li.dataset.chat = chat;
    li.addEventListener("click", () => select(chat));
    $("chats").appendChild(li);
  }

  function open(chat) {
    send({ type: "open", chat: chat });
  }

  function select(chat) {
    state.current = chat;
    localStorage.setItem(CHAT_ITEM, chat);
    $("chat-title").textContent = "# " + chat;
    for (const li of $("chats").children) {
      li.setAttribute("aria-current", li.dataset.chat === chat ? "true" : "false");
    }
    for (const li of $("messages").children) {
      li.hidden = li.dataset.chat !== chat;
    }
    $("typing").hidden = true;
    note("");
    $("text").focus();
  }

  function history(chat, messages) {
    listChat(chat);
    for (const li of Array.from($("messages").children)) {
      if (li.dataset.chat === chat) {
        li.remove();
      }
    }
    for (const message of messages) {
      addMessage(message);
    }
    if (state.current === null || !state.chats.includes(state.current) || state.pendingOpen === chat) {
      state.pendingOpen = null;
      select(chat);
    } else {
      select(state.current);
    }
  }

  function render(li, message) {
    li.replaceChildren();
    const meta = document.createElement("span");
    meta.className = "meta";
    meta.textContent = message.sender + (message.edited ? " (edited)" : "");
    if (message.redelivery) {
      const badge = document.createElement("span");
      badge.className = "badge";
      badge.textContent = "redelivered: may repeat";
      meta.appendChild(badge);
    }
    const body = document.createElement("span");
    body.className = "text";
    body.textContent = message.text;
    li.append(meta, body);
  }

  function addMessage(message) {
    const existing = document.querySelector(`#messages li[data-id="${CSS.escape(message.id)}"]`);
    const li = existing || document.createElement("li");
    li.className = "message";
    li.dataset.id = message.id;
    li.dataset.chat = message.chat;
    li.dataset.sender = message.sender;
    li.dataset.bot = String(Boolean(message.bot));
    li.dataset.redelivery = String(Boolean(message.redelivery));
    render(li, message);
    li.hidden = message.chat !== state.current;
    if (!existing) {
      $("messages").appendChild(li);
      li.scrollIntoView({ block: "end" });
    }
  }

  function editMessage(message) {
    const li = document.querySelector(`#messages li[data-id="${CSS.escape(message.id)}"]`);
    if (li) {
      render(li, message);
    }
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("join-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const name = $("name").value.trim();
      if (!name) {
        return;
      }
      localStorage.setItem(NAME_ITEM, name);
      send({ type: "hello", key: key(), name: name });
    });
    const chatName = $("new-chat");
    chatName.addEventListener("input", () => {
      // The browser's own message for a name that does not match says the rule.
      chatName.setCustomValidity("");
      if (chatName.validity.patternMismatch) {
        chatName.setCustomValidity(chatName.title);
      }
    });
    $("new-chat-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const chat = $("new-chat").value.trim().toLowerCase();
      if (!chat) {
        return;
      }
      state.pendingOpen = chat;
      $("new-chat").value = "";
      open(chat);
    });
    $("composer").addEventListener("submit", (event) => {
      event.preventDefault();
      const text = $("text").value;
      if (!text.trim() || state.current === null) {
        return;
      }
      if (text.length > 60000) {
        // Past what the server reads at all; anything shorter it checks (and refuses) itself.
        note(`Not sent: message too long: ${text.length} characters, at most ${state.maxText}`);
        return;
      }
      if (send({ type: "send", chat: state.current, text: text })) {
        state.pending = { chat: state.current, text: text, echoed: false };
        note("");
      }
    });
    $("text").addEventListener("input", () => {
      $("count").textContent = String($("text").value.length);
    });
    $("text").addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !event.shiftKey) {
        event.preventDefault();
        $("composer").requestSubmit();
      }
    });
    connect();
  });
})();
