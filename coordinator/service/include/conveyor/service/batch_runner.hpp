#pragma once
// Offline batch serving (`conveyor batch`): a JSONL file of requests run through an
// inference_service at full throughput, one result line per request, in input order, errors
// included. Resumable: ids already in the output (an interrupted run) are skipped, the rest appended.
//
// Input, one JSON object per line (blank lines are ignored):
//   {"id": "q1", "prompt_ids": [1, 2, 3], "max_tokens": 32, "temperature": 0.8, "top_k": 40,
//    "top_p": 0.9, "seed": 7, "stop_ids": [2], "ignore_eos": false, "deadline_s": 30}
// "prompt": "text" instead of prompt_ids needs a tokenizer. Only prompt_ids/prompt is required; "id"
// defaults to the line number; "max_new_tokens" is accepted for "max_tokens". Unknown keys are errors.
// Output, one line per input line that has a request:
//   {"id": "q1", "tokens": [...], "text": "...", "finish_reason": "length", "prompt_tokens": 3,
//    "completion_tokens": 32, "first_token_s": 0.01, "total_s": 0.2}
//   {"id": "q2", "error": {"code": "invalid_argument", "message": "line 2: ..."}}
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "conveyor/base/result.hpp"
#include "conveyor/service/inference_service.hpp"

namespace conveyor::tokenizer {
class tokenizer;
}

namespace conveyor::service {

struct batch_progress {
  std::int64_t total = 0;    ///< input lines with a request (blank lines aside)
  std::int64_t skipped = 0;  ///< already in the output from an earlier run
  std::int64_t done = 0;     ///< finished in this run, errors included
  std::int64_t errors = 0;   ///< of those, lines whose result is an error
  std::int64_t retries = 0;  ///< resubmissions after the service said "overloaded"
  std::int64_t tokens = 0;   ///< generated in this run
  double elapsed_s = 0.0;
};

struct batch_options {
  int window = 64;  ///< requests submitted and not finished at once
  /// First wait before resubmitting a request the service turned away as overloaded (doubles up
  /// to 1 s): admission control is a signal to slow down, never a reason to drop a line.
  double overload_backoff_s = 0.02;
  const tokenizer::tokenizer* tokenizer = nullptr;  ///< for "prompt" text and "text"; null = ids only
  std::function<void(const batch_progress&)> on_progress;  ///< after each batch of completions
};


/// Runs every request of `input_path` through `service`, appending result lines to `output_path`.
/// A bad input line or a failed request is a result line with "error"; only trouble with the files
/// themselves is an error here.
result<batch_progress> run_batch(inference_service& service, const std::string& input_path,
                                 const std::string& output_path, const batch_options& options);

}  // namespace conveyor::service
