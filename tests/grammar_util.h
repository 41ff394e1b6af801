// Grammar helpers shared by the grammar, regex and JSON-schema tests.
#pragma once

#include <memory>
#include <string>

#include "serve/grammar.h"

namespace lathe::testing {

// True when the grammar accepts all of `text` byte by byte and is complete at its end.
inline bool GrammarMatches(const std::shared_ptr<const serve::Grammar>& g, const std::string& text) {
  serve::GrammarMatcher m(g, serve::GrammarVocab::Bytes());
  return m.AcceptBytes(text) && m.Complete();
}

}  // namespace lathe::testing
