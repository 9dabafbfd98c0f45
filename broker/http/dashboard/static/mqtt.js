// A small MQTT 3.1.1 client over WebSocket for the dashboard's WebSocket page: connect,
// subscribe, publish at QoS 0 or 1, receive at any QoS, keep alive. Written here rather than
// vendoring MQTT.js (~400 KB) for a page that needs a few packet types.

const enc = new TextEncoder();

function utf8(text) {
  const bytes = enc.encode(text);
  return [bytes.length >> 8, bytes.length & 255, ...bytes];
}

function packet(first, body) {
  const length = [];
  let n = body.length;
  do {
    let digit = n % 128;
    n = Math.floor(n / 128);
    if (n > 0) digit |= 128;
    length.push(digit);
  } while (n > 0);
  return new Uint8Array([first, ...length, ...body]);
}

export class MqttClient {
  // handlers: {onConnect(), onMessage({topic, payload: Uint8Array, qos, retain}),
  // onSuback(packetId, codes), onClose(reason)}
  constructor(url, handlers) {
    this.url = url;
    this.handlers = handlers;
    this.nextId = 1;
    this.buffer = new Uint8Array(0);
    this.socket = null;
    this.timer = null;
  }

  connect({ clientId, username, password, keepalive = 30, clean = true }) {
    const socket = new WebSocket(this.url, ["mqtt"]);
    this.socket = socket;
    socket.binaryType = "arraybuffer";
    socket.onopen = () => {
      let flags = clean ? 0x02 : 0;
      const payload = [...utf8(clientId)];
      if (username) { flags |= 0x80; payload.push(...utf8(username)); }
      if (username && password) { flags |= 0x40; payload.push(...utf8(password)); }
      const header = [...utf8("MQTT"), 4, flags, keepalive >> 8, keepalive & 255];
      this.send(packet(0x10, [...header, ...payload]));
      this.timer = setInterval(() => this.send(new Uint8Array([0xc0, 0])), keepalive * 500);
    };
    socket.onmessage = (event) => this.receive(new Uint8Array(event.data));
    socket.onclose = () => {
      clearInterval(this.timer);
      this.handlers.onClose?.("connection closed");
    };
    socket.onerror = () => this.handlers.onClose?.("connection failed");
  }

  send(bytes) {
    if (this.socket?.readyState === WebSocket.OPEN) this.socket.send(bytes);
  }

  packetId() {
    const id = this.nextId;
    this.nextId = id === 65535 ? 1 : id + 1;
    return id;
  }

  subscribe(filter, qos) {
    const id = this.packetId();
    this.send(packet(0x82, [id >> 8, id & 255, ...utf8(filter), qos]));
    return id;
  }

  publish(topic, payload, qos, retain) {
    const body = [...utf8(topic)];
    if (qos > 0) {
      const id = this.packetId();
      body.push(id >> 8, id & 255);
    }
    body.push(...enc.encode(payload));
    this.send(packet(0x30 | (qos << 1) | (retain ? 1 : 0), body));
  }

  disconnect() {
    this.send(new Uint8Array([0xe0, 0]));
    this.socket?.close();
  }

  // WebSocket frames need not align with MQTT packets: keep what is left of one.
  receive(chunk) {
    const joined = new Uint8Array(this.buffer.length + chunk.length);
    joined.set(this.buffer);
    joined.set(chunk, this.buffer.length);
    let at = 0;
    for (;;) {
      let length = 0, multiplier = 1, i = at + 1;
      for (; i < joined.length; i++) {
        length += (joined[i] & 127) * multiplier;
        multiplier *= 128;
        if ((joined[i] & 128) === 0) break;
      }
      if (i >= joined.length || i + 1 + length > joined.length) break;
      this.dispatch(joined[at], joined.subarray(i + 1, i + 1 + length));
      at = i + 1 + length;
    }
    this.buffer = joined.slice(at);
  }

  dispatch(first, body) {
    const type = first >> 4;
    if (type === 2) {  // CONNACK
      if (body[1] === 0) this.handlers.onConnect?.();
      else this.handlers.onClose?.(`refused: CONNACK return code ${body[1]}`);
    } else if (type === 3) {  // PUBLISH
      const qos = (first >> 1) & 3;
      const topicLength = (body[0] << 8) | body[1];
      const topic = new TextDecoder().decode(body.subarray(2, 2 + topicLength));
      let at = 2 + topicLength;
      if (qos > 0) {
        const id = [body[at], body[at + 1]];
        at += 2;
        this.send(new Uint8Array([qos === 1 ? 0x40 : 0x50, 2, ...id]));  // PUBACK / PUBREC
      }
      this.handlers.onMessage?.({ topic, payload: body.slice(at), qos, retain: (first & 1) === 1 });
    } else if (type === 6) {  // PUBREL: complete an incoming QoS 2 message
      this.send(new Uint8Array([0x70, 2, body[0], body[1]]));
    } else if (type === 9) {  // SUBACK
      this.handlers.onSuback?.((body[0] << 8) | body[1], [...body.subarray(2)]);
    }
  }
}
