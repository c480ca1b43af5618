// Node clients, unmodified, against the llmq stack at LLMQ_BASE_URL (…/v1): the
// openai package's responses.create (plain and streamed) and embeddings.create, and
// the AI SDK's default OpenAI provider (`openai(model)` is the Responses API) for
// generateText, streamText and a tool call. Prints one JSON object of what each
// returned; tests/test_node_clients.py asserts on it.
import OpenAI from "openai";
import { createOpenAI } from "@ai-sdk/openai";
import { generateText, jsonSchema, streamText, tool } from "ai";

const baseURL = process.env.LLMQ_BASE_URL;
const client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0 });
const out = {};

const created = await client.responses.create({
  model: "mock",
  instructions: "Be brief.",
  input: "Say hello",
  max_output_tokens: 5,
  ignore_eos: true,
});
out.create = {
  id: created.id,
  status: created.status,
  text: created.output_text,
  outputTokens: created.usage.output_tokens,
};

const stream = await client.responses.create({
  model: "mock",
  input: "stream please",
  max_output_tokens: 4,
  ignore_eos: true,
  stream: true,
});
const kinds = [];
let deltas = "";
let last;
for await (const event of stream) {
  kinds.push(event.type);
  if (event.type === "response.output_text.delta") deltas += event.delta;
  last = event;
}
out.stream = { kinds, deltas, finalText: last.response.output_text ?? null, lastStatus: last.response.status };

const embedded = await client.embeddings.create({ model: "mock", input: ["one two", "three"], dimensions: 8 });
out.embeddings = embedded.data.map((d) => d.embedding);

const provider = createOpenAI({ baseURL, apiKey: "unused" });
const generated = await generateText({
  model: provider("mock"),
  prompt: "Say hello",
  maxOutputTokens: 6,
  providerOptions: { openai: { store: true } },
  maxRetries: 0,
});
out.generateText = {
  text: generated.text,
  finishReason: generated.finishReason,
  outputTokens: generated.usage.outputTokens,
  responseId: generated.response.id,
};

const streamed = streamText({ model: provider("mock"), prompt: "stream", maxOutputTokens: 5, maxRetries: 0 });
let streamedText = "";
for await (const piece of streamed.textStream) streamedText += piece;
out.streamText = { text: streamedText, finishReason: await streamed.finishReason };

const called = await generateText({
  model: provider("mock"),
  prompt: "weather in Paris?",
  maxOutputTokens: 200,
  toolChoice: "required",
  tools: {
    get_weather: tool({
      description: "Weather in a city",
      inputSchema: jsonSchema({
        type: "object",
        properties: { city: { type: "string" } },
        required: ["city"],
        additionalProperties: false,
      }),
      execute: async ({ city }) => `sunny in ${city}`,
    }),
  },
  maxRetries: 0,
});
out.toolCall = {
  calls: called.toolCalls.map((c) => ({ name: c.toolName, input: c.input })),
  results: called.toolResults.map((r) => r.output),
};

console.log(JSON.stringify(out));
