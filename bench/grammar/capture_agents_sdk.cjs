// The OpenAI Agents SDK's side of bench/grammar/capture_schemas.py: an agent built as the SDK's
// documentation builds them (function tools from zod parameters, one with nullable and bounded
// fields, an agent as a tool, a handoff, a structured output type), run once against the capture
// server, which records the request and answers 503. The JSON schemas in that request are the
// SDK's own conversion of the zod definitions (strict mode: every property required, nullable as
// a union with null, additionalProperties false).
//
//     node bench/grammar/capture_agents_sdk.cjs <npm packages dir> <base URL>
const { createRequire } = require('module');
const pkg = createRequire(`${process.argv[2]}/node_modules/`);
const { Agent, run, tool, setDefaultOpenAIClient, setTracingDisabled } = pkg('@openai/agents');
const { OpenAI } = pkg('openai');
const { z } = pkg('zod');

setTracingDisabled(true);
setDefaultOpenAIClient(new OpenAI({ apiKey: 'sk-capture', baseURL: process.argv[3], maxRetries: 0 }));

const getWeather = tool({
  name: 'get_weather',
  description: 'Get the weather for a given city',
  parameters: z.object({ city: z.string() }),
  execute: async ({ city }) => `The weather in ${city} is sunny`,
});
const bookFlight = tool({
  name: 'book_flight',
  description: 'Book a flight for the user',
  parameters: z.object({
    origin: z.string().length(3).describe('IATA airport code'),
    destination: z.string().length(3),
    date: z.string().describe('YYYY-MM-DD'),
    passengers: z.number().int().min(1).max(9),
    cabin: z.enum(['economy', 'premium', 'business', 'first']),
    seat_preference: z.string().max(20).nullable(),
    frequent_flyer: z.object({ airline: z.string(), number: z.string() }).nullable(),
  }),
  execute: async () => 'booked',
});
const searchDocs = tool({
  name: 'search_docs',
  description: 'Search the knowledge base',
  parameters: z.object({
    query: z.string().min(1).max(200),
    filters: z.array(z.object({ field: z.string(), value: z.string() })).max(5),
    top_k: z.number().int().min(1).max(50),
  }),
  execute: async () => '[]',
});
const summarizer = new Agent({ name: 'Summarizer', instructions: 'Summarize the text you are given.' });
const spanish = new Agent({ name: 'Spanish agent', instructions: 'You only speak Spanish.' });
const Report = z.object({
  title: z.string().max(80),
  summary: z.string(),
  sentiment: z.enum(['positive', 'neutral', 'negative']),
  action_items: z.array(
    z.object({ owner: z.string(), task: z.string(), due: z.string().nullable() })),
});
const agent = new Agent({
  name: 'Assistant',
  instructions: 'You are a helpful assistant.',
  model: 'capture',
  tools: [getWeather, bookFlight, searchDocs,
          summarizer.asTool({ toolName: 'summarize_text', toolDescription: 'Summarize a text' })],
  handoffs: [spanish],
  outputType: Report,
});
run(agent, 'What is the weather in Tokyo?')
  .catch(() => {})
  .finally(() => process.exit(0));
