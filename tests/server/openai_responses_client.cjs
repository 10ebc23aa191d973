// Drives a live offgraph server's Responses API with the official `openai` npm package (pinned by
// scripts/npm-client.sh) and, when AGENTS_DIR is given, the OpenAI Agents SDK (its own pinned
// directory: npm-client.sh agents-sdk) running one function tool. Usage:
//   node openai_responses_client.cjs NPM_DIR BASE_URL API_KEY MODEL [AGENTS_DIR]
// Exits 0 when every check holds; prints each check and, on failure, what was seen.
'use strict';
const path = require('path');
const assert = require('assert/strict');

const [npmDir, base, key, model, agentsDir] = process.argv.slice(2);
const OpenAI = require(path.join(npmDir, 'node_modules', 'openai'));
const { zodTextFormat } = require(path.join(npmDir, 'node_modules', 'openai', 'helpers', 'zod'));
const { z } = require(path.join(npmDir, 'node_modules', 'zod'));
const client = new OpenAI({ baseURL: base + '/v1', apiKey: key, maxRetries: 0, timeout: 120000 });

const checks = [
  ['responses.create: output text and usage', async () => {
    const r = await client.responses.create({
      model, input: 'Say hello', max_output_tokens: 24, temperature: 0,
    });
    assert.equal(r.object, 'response');
    assert.ok(['completed', 'incomplete'].includes(r.status), r.status);
    assert.equal(typeof r.output_text, 'string');
    assert.ok(r.usage.input_tokens > 0 && r.usage.output_tokens > 0);
    globalThis.first = r;
  }],
  ['responses.stream: the final response equals responses.create', async () => {
    const body = { model, input: 'Say hello', max_output_tokens: 24, temperature: 0 };
    const stream = client.responses.stream(body);
    let deltas = '';
    stream.on('response.output_text.delta', (e) => { deltas += e.delta; });
    const r = await stream.finalResponse();
    const w = globalThis.first;
    assert.equal(r.output_text, w.output_text);
    assert.equal(deltas, w.output_text);
    assert.equal(r.status, w.status);
    assert.equal(r.usage.output_tokens, w.usage.output_tokens);
  }],
  ['responses.parse with a zod schema', async () => {
    const Forecast = z.object({ city: z.enum(['Oslo', 'Paris']), days: z.number().int().min(1).max(7) });
    const r = await client.responses.parse({
      model, input: 'Forecast for Oslo?', max_output_tokens: 200, temperature: 0,
      reasoning: { effort: 'none' }, text: { format: zodTextFormat(Forecast, 'forecast') },
    });
    assert.ok(r.output_parsed, JSON.stringify(r.output));
    assert.ok(['Oslo', 'Paris'].includes(r.output_parsed.city));
    assert.ok(Number.isInteger(r.output_parsed.days));
  }],
  ['previous_response_id continues a stored response', async () => {
    const r = await client.responses.create({
      model, input: 'And again', previous_response_id: globalThis.first.id, max_output_tokens: 8,
      temperature: 0,
    });
    assert.equal(r.previous_response_id, globalThis.first.id);
    assert.ok(r.usage.input_tokens_details.cached_tokens > 0, JSON.stringify(r.usage));
    const got = await client.responses.retrieve(globalThis.first.id);
    assert.equal(got.id, globalThis.first.id);
  }],
  ['a hosted tool is refused by name', async () => {
    try {
      await client.responses.create({ model, input: 'x', tools: [{ type: 'web_search' }] });
    } catch (e) {
      assert.equal(e.status, 400);
      assert.ok(e.message.includes('web_search'), e.message);
      return;
    }
    assert.fail('expected a 400');
  }],
];

if (agentsDir) {
  checks.push(['the Agents SDK runs a function tool through the Responses API', async () => {
    const agents = require(path.join(agentsDir, 'node_modules', '@openai', 'agents'));
    const AgentsOpenAI = require(path.join(agentsDir, 'node_modules', 'openai'));
    const z4 = require(path.join(agentsDir, 'node_modules', 'zod'));
    agents.setDefaultOpenAIClient(new AgentsOpenAI({ baseURL: base + '/v1', apiKey: key, maxRetries: 0 }));
    agents.setOpenAIAPI('responses');
    agents.setTracingDisabled(true);
    let called = 0;
    const weather = agents.tool({
      name: 'get_weather',
      description: 'Weather of a city',
      parameters: z4.object({ city: z4.enum(['Oslo', 'Paris']) }),
      execute: async ({ city }) => { called++; return `${city}: sunny`; },
    });
    const agent = new agents.Agent({
      name: 'weather', instructions: 'Answer with the weather tool.', model, tools: [weather],
      modelSettings: { toolChoice: 'get_weather', temperature: 0, maxTokens: 120, parallelToolCalls: false,
        reasoning: { effort: 'none' } },
      // The tool's result is the answer: a random model's free text after it could run on.
      toolUseBehavior: 'stop_on_first_tool',
    });
    const result = await agents.run(agent, 'Weather in Oslo?', { maxTurns: 3 });
    assert.equal(called, 1, 'the tool ran once');
    assert.ok(['Oslo: sunny', 'Paris: sunny'].includes(result.finalOutput), result.finalOutput);
  }]);
}

(async () => {
  let passed = 0;
  for (const [name, check] of checks) {
    try {
      await check();
      passed++;
      console.log(`ok   ${name}`);
    } catch (e) {
      console.log(`FAIL ${name}: ${e.stack || e}`);
    }
  }
  console.log(`${passed} of ${checks.length} checks passed`);
  process.exit(passed === checks.length ? 0 : 1);
})();
