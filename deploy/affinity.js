// (njs 0.7, Debian bookworm's: ES5 with a few additions, so no for-of.)
// Conversation affinity for nginx's `hash ... consistent` (deploy/nginx.conf.in): the key that
// sends every turn of a conversation to the replica holding its KV cache.
//   1. a session header the client sets: X-Session-Id, X-Conversation-Id, Claude Code's
//      X-Claude-Code-Session-Id or Codex's session-id;
//   2. else the Responses API's prompt_cache_key;
//   3. else the conversation's first messages (chat: the system message, if any, and the first
//      user message; Anthropic's Messages: its `system` too; completions: the first 512
//      characters of the prompt), which every later turn resends unchanged;
//   4. else (a body nginx could not read, or neither field) a random key: any replica will do.
function key(r) {
  var session = r.headersIn['X-Session-Id'] || r.headersIn['X-Conversation-Id'] ||
      r.headersIn['X-Claude-Code-Session-Id'] || r.headersIn['session-id'];
  if (session) return 's:' + session;
  var body = null;
  try {
    body = JSON.parse(r.requestText || '');
  } catch (e) {
    body = null;
  }
  // The Responses API's own session key (Codex sends its thread id).
  if (body && typeof body.prompt_cache_key === 'string' && body.prompt_cache_key)
    return 'k:' + body.prompt_cache_key;
  if (body && Array.isArray(body.messages)) {
    var first = [];
    for (var i = 0; i < body.messages.length; i++) {
      var m = body.messages[i];
      first.push(JSON.stringify(m));
      if (m && m.role === 'user') break;
    }
    if (first.length) {
      var system = body.system === undefined ? '' : JSON.stringify(body.system) + '\n';
      return 'm:' + system + first.join('\n');
    }
  }
  if (body && typeof body.prompt === 'string') return 'p:' + body.prompt.slice(0, 512);
  if (body && Array.isArray(body.prompt)) return 'p:' + JSON.stringify(body.prompt).slice(0, 512);
  return 'r:' + Math.random();
}

export default {key};
