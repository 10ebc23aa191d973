// Drives a live offgraph server with the official `openai` npm package (pinned by
// scripts/npm-client.sh): a client nobody here wrote. Usage:
//   node openai_client.cjs NPM_DIR BASE_URL API_KEY
// Exits 0 when every check holds; prints each check and, on failure, what was seen.
'use strict';
const path = require('path');
const assert = require('assert/strict');

const [npmDir, base, key] = process.argv.slice(2);
const OpenAI = require(path.join(npmDir, 'node_modules', 'openai'));
const { zodResponseFormat, zodFunction } =
  require(path.join(npmDir, 'node_modules', 'openai', 'helpers', 'zod'));
const { z } = require(path.join(npmDir, 'node_modules', 'zod'));
const client = new OpenAI({ baseURL: base + '/v1', apiKey: key, maxRetries: 0, timeout: 120000 });
const wrongKey = new OpenAI({ baseURL: base + '/v1', apiKey: key + 'x', maxRetries: 0 });

const tools = [
  {
    type: 'function',
    function: {
      name: 'get_weather',
      description: 'Weather of a city',
      // Strict, the city one of a few: the forced call completes within max_tokens (a call cut
      // short is reported as a cut, finish_reason "length", never as a call).
      strict: true,
      parameters: { type: 'object', properties: { city: { type: 'string', enum: ['Oslo', 'Paris'] } },
        required: ['city'], additionalProperties: false },
    },
  },
];

async function expectError(promise, status, check) {
  try {
    await promise;
  } catch (e) {
    assert.ok(e instanceof OpenAI.APIError, `not an APIError: ${e}`);
    assert.equal(e.status, status, `status ${e.status}: ${e.message}`);
    if (check) check(e);
    return;
  }
  assert.fail(`expected HTTP ${status}`);
}

const checks = [
  ['models.list names the served model', async () => {
    const models = [];
    for await (const m of client.models.list()) models.push(m);
    assert.equal(models.length, 1);
    assert.equal(models[0].id, 'openai-test');
  }],
  ['chat, not streamed', async () => {
    const r = await client.chat.completions.create({
      model: 'openai-test', messages: [{ role: 'user', content: 'Say hello' }], max_tokens: 8,
      temperature: 0,
    });
    assert.equal(r.object, 'chat.completion');
    assert.equal(r.choices[0].message.role, 'assistant');
    assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
    assert.ok(r.usage.prompt_tokens > 10);
    assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
    globalThis.whole = r;
  }],
  ['chat, streamed: the deltas add up to the same answer', async () => {
    const stream = await client.chat.completions.create({
      model: 'openai-test', messages: [{ role: 'user', content: 'Say hello' }], max_tokens: 8,
      temperature: 0, stream: true, stream_options: { include_usage: true },
    });
    let content = '', reasoning = '', finish = null, usage = null;
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage;
      if (!chunk.choices.length) continue;
      content += chunk.choices[0].delta.content || '';
      reasoning += chunk.choices[0].delta.reasoning_content || '';
      if (chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason;
    }
    const w = globalThis.whole.choices[0];
    assert.equal(content, w.message.content);
    assert.equal(reasoning, w.message.reasoning_content || '');
    assert.equal(finish, w.finish_reason);
    assert.equal(usage.completion_tokens, globalThis.whole.usage.completion_tokens);
  }],
  ['tool call with a named tool_choice, not streamed', async () => {
    const r = await client.chat.completions.create({
      model: 'openai-test', messages: [{ role: 'user', content: 'Weather in Oslo?' }],
      tools, tool_choice: { type: 'function', function: { name: 'get_weather' } },
      max_tokens: 80, temperature: 0, reasoning_effort: 'none', parallel_tool_calls: false,
    });
    const call = r.choices[0].message.tool_calls[0];
    assert.equal(call.type, 'function');
    assert.equal(call.function.name, 'get_weather');
    assert.equal(typeof JSON.parse(call.function.arguments), 'object');
    assert.equal(r.choices[0].finish_reason, 'tool_calls');
  }],
  ['tool call, streamed, and a tool result sent back', async () => {
    const stream = await client.chat.completions.create({
      model: 'openai-test', messages: [{ role: 'user', content: 'Weather in Oslo?' }],
      tools, tool_choice: 'required', max_tokens: 80, temperature: 0, stream: true,
      reasoning_effort: 'none', parallel_tool_calls: false,
    });
    let name = '', args = '', id = '';
    for await (const chunk of stream) {
      for (const tc of (chunk.choices[0] && chunk.choices[0].delta.tool_calls) || []) {
        if (tc.id) id = tc.id;
        if (tc.function && tc.function.name) name += tc.function.name;
        if (tc.function && tc.function.arguments) args += tc.function.arguments;
      }
    }
    assert.equal(name, 'get_weather');
    const r = await client.chat.completions.create({
      model: 'openai-test', max_tokens: 4, temperature: 0, tools,
      messages: [
        { role: 'user', content: 'Weather in Oslo?' },
        { role: 'assistant', content: '', tool_calls: [{ id, type: 'function',
          function: { name, arguments: args || '{}' } }] },
        { role: 'tool', tool_call_id: id, content: '{"celsius": 4}' },
      ],
    });
    assert.ok(r.usage.prompt_tokens > 20);
  }],
  ['n = 2 choices', async () => {
    const r = await client.chat.completions.create({
      model: 'openai-test', messages: [{ role: 'user', content: 'Two ideas' }], max_tokens: 6,
      temperature: 1, seed: 7, n: 2,
    });
    assert.deepEqual(r.choices.map((c) => c.index), [0, 1]);
  }],
  ['legacy completions', async () => {
    const r = await client.completions.create({
      model: 'openai-test', prompt: 'Once upon a time', max_tokens: 5, temperature: 0,
    });
    assert.equal(r.object, 'text_completion');
    assert.equal(typeof r.choices[0].text, 'string');
  }],
  ['logprobs: chat, and a scored prompt through legacy completions', async () => {
    const r = await client.chat.completions.create({
      model: 'openai-test', messages: [{ role: 'user', content: 'Say hello' }], max_tokens: 6,
      temperature: 0, logprobs: true, top_logprobs: 2,
    });
    const content = r.choices[0].logprobs.content;
    assert.equal(content.length, r.usage.completion_tokens);
    for (const t of content) {
      assert.equal(typeof t.token, 'string');
      assert.ok(t.logprob <= 0);
      assert.ok(Array.isArray(t.bytes));
      assert.equal(t.top_logprobs.length, 2);
      assert.equal(t.top_logprobs[0].logprob, t.logprob); // greedy takes the likeliest
    }
    const c = await client.completions.create({
      model: 'openai-test', prompt: 'Once upon a time', max_tokens: 0, echo: true, logprobs: 1,
    });
    const lp = c.choices[0].logprobs;
    assert.equal(c.choices[0].text, 'Once upon a time');
    assert.equal(lp.tokens.length, c.usage.prompt_tokens);
    assert.equal(lp.token_logprobs[0], null);
    assert.ok(lp.token_logprobs.slice(1).every((x) => x <= 0));
  }],
  ['response_format from zod, parsed by the client', async () => {
    const Forecast = z.object({
      city: z.enum(['Oslo', 'Paris']),
      days: z.number().int().min(1).max(7),
      windy: z.boolean(),
      note: z.string().max(12).nullable(),
    });
    for (const temperature of [0, 1]) {
      const r = await client.chat.completions.parse({
        model: 'openai-test', messages: [{ role: 'user', content: 'Forecast for Oslo?' }],
        response_format: zodResponseFormat(Forecast, 'forecast'), max_tokens: 200, temperature,
        seed: 3, reasoning_effort: 'none',
      });
      const parsed = r.choices[0].message.parsed;
      assert.ok(parsed, `nothing parsed from ${JSON.stringify(r.choices[0])}`);
      assert.deepEqual(Forecast.parse(parsed), parsed);
      assert.equal(r.choices[0].finish_reason, 'stop');
    }
  }],
  ['strict tool from zod, its arguments parsed by the client', async () => {
    const r = await client.chat.completions.parse({
      model: 'openai-test', messages: [{ role: 'user', content: 'Weather in Oslo?' }],
      tools: [zodFunction({
        name: 'get_weather',
        parameters: z.object({ city: z.string().max(10), days: z.number().int().min(1).max(3) }),
      })],
      tool_choice: 'required', parallel_tool_calls: false, max_tokens: 200, temperature: 1,
      seed: 5, reasoning_effort: 'none',
    });
    const calls = r.choices[0].message.tool_calls;
    assert.equal(calls.length, 1);
    const args = calls[0].function.parsed_arguments;
    assert.equal(typeof args.city, 'string');
    assert.ok(args.city.length <= 10, args.city);
    assert.ok(Number.isInteger(args.days) && args.days >= 1 && args.days <= 3, `${args.days}`);
  }],
  ['a schema the server cannot enforce is refused by keyword and path', async () => {
    await expectError(client.chat.completions.create({
      model: 'openai-test', messages: [{ role: 'user', content: 'x' }],
      response_format: { type: 'json_schema', json_schema: { name: 'x', strict: true, schema: {
        type: 'object', properties: { a: { type: 'string', not: { const: 'b' } } },
        required: ['a'], additionalProperties: false } } },
    }), 400, (e) => {
      assert.equal(e.code, 'invalid_json_schema');
      assert.match(e.message, /'not' at #\/properties\/a/);
    });
  }],
  ['errors: out of range, unknown model, context, wrong key', async () => {
    await expectError(client.chat.completions.create({
      model: 'openai-test', messages: [{ role: 'user', content: 'x' }], temperature: 7,
    }), 400, (e) => {
      assert.equal(e.param, 'temperature');
      assert.match(e.message, /between 0 and 2/);
    });
    await expectError(client.chat.completions.create({
      model: 'gpt-unknown', messages: [{ role: 'user', content: 'x' }],
    }), 404, (e) => assert.ok(e instanceof OpenAI.NotFoundError));
    await expectError(client.chat.completions.create({
      model: 'openai-test', messages: [{ role: 'user', content: 'x'.repeat(10) }],
      max_tokens: 100000,
    }), 400);
    await expectError(wrongKey.models.list(), 401,
      (e) => assert.ok(e instanceof OpenAI.AuthenticationError));
  }],
];

(async () => {
  let failed = 0;
  for (const [name, run] of checks) {
    try {
      await run();
      console.log(`ok   ${name}`);
    } catch (e) {
      failed++;
      console.log(`FAIL ${name}: ${e && e.stack ? e.stack : e}`);
    }
  }
  console.log(`${checks.length - failed} of ${checks.length} checks passed`);
  process.exit(failed ? 1 : 0);
})();
