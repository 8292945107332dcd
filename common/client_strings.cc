#include "common/client_strings.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace gradd {
namespace {

// How much of a bad value an error message quotes.
constexpr size_t kQuotedBytes = 64;

// The UTF-8 sequence starting at text[i]: its length (1-4) and code point,
// or 0 when text[i] does not start a well-formed sequence (RFC 3629,
// table 3-7 of the Unicode standard).
int DecodeOne(absl::string_view text, size_t i, uint32_t* code_point) {
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(text[i + k]); };
  const uint8_t b0 = byte(0);
  if (b0 < 0x80) {
    *code_point = b0;
    return 1;
  }
  int len = 0;
  uint8_t lo = 0x80, hi = 0xBF;  // bounds of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3;
    if (b0 == 0xE0) lo = 0xA0;  // overlong
    if (b0 == 0xED) hi = 0x9F;  // surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4;
    if (b0 == 0xF0) lo = 0x90;  // overlong
    if (b0 == 0xF4) hi = 0x8F;  // past U+10FFFF
  } else {
    return 0;
  }
  if (text.size() - i < static_cast<size_t>(len)) return 0;
  if (byte(1) < lo || byte(1) > hi) return 0;
  for (int k = 2; k < len; ++k) {
    if (byte(k) < 0x80 || byte(k) > 0xBF) return 0;
  }
  uint32_t cp = b0 & (0x7F >> len);
  for (int k = 1; k < len; ++k) cp = (cp << 6) | (byte(k) & 0x3F);
  *code_point = cp;
  return len;
}

bool IsControl(uint32_t cp) { return cp < 0x20 || (cp >= 0x7F && cp <= 0x9F); }

// Code points a client string may not hold (and a log line shows escaped).
bool IsRefused(uint32_t cp) {
  return IsControl(cp) || cp == 0x2028 || cp == 0x2029;
}

void AppendEscaped(uint32_t cp, std::string* out) {
  switch (cp) {
    case '\n':
      out->append("\\n");
      return;
    case '\r':
      out->append("\\r");
      return;
    case '\t':
      out->append("\\t");
      return;
  }
  if (cp < 0x80) {
    absl::StrAppendFormat(out, "\\x%02x", cp);
  } else {
    absl::StrAppendFormat(out, "\\u%04x", cp);
  }
}

std::string Quote(absl::string_view value) {
  const bool cut = value.size() > kQuotedBytes;
  return absl::StrCat("'", EscapeForLog(value.substr(0, kQuotedBytes)),
                      cut ? "'..." : "'");
}

}  // namespace

size_t FindInvalidUtf8(absl::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    // ASCII runs are the common case.
    if (static_cast<uint8_t>(text[i]) < 0x80) {
      ++i;
      continue;
    }
    uint32_t cp = 0;
    const int len = DecodeOne(text, i, &cp);
    if (len == 0) return i;
    i += len;
  }
  return absl::string_view::npos;
}

absl::Status CheckClientString(absl::string_view field, absl::string_view value,
                               size_t max_bytes) {
  if (value.size() > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " is ", value.size(), " bytes; the limit is ",
                     max_bytes, " (", Quote(value), ")"));
  }
  size_t i = 0;
  while (i < value.size()) {
    uint32_t cp = 0;
    const int len = DecodeOne(value, i, &cp);
    if (len == 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s is not valid UTF-8: byte %d is 0x%02X (%s)", field, i,
          static_cast<uint8_t>(value[i]), Quote(value)));
    }
    if (IsRefused(cp)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s %s contains %s U+%04X at byte %d (no control characters or "
          "line breaks allowed)",
          field, Quote(value),
          IsControl(cp)  ? "control character"
          : cp == 0x2028 ? "line separator"
                         : "paragraph separator",
          cp, i));
    }
    i += len;
  }
  return absl::OkStatus();
}

bool NeedsEscapeForLog(absl::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const uint8_t b = static_cast<uint8_t>(text[i]);
    if (b >= 0x20 && b < 0x7F) {
      ++i;
      continue;
    }
    uint32_t cp = 0;
    const int len = DecodeOne(text, i, &cp);
    if (len == 0 || IsRefused(cp)) return true;
    i += len;
  }
  return false;
}

std::string EscapeForLog(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    uint32_t cp = 0;
    const int len = DecodeOne(text, i, &cp);
    if (len == 0) {
      absl::StrAppendFormat(&out, "\\x%02x", static_cast<uint8_t>(text[i]));
      ++i;
      continue;
    }
    if (IsRefused(cp)) {
      AppendEscaped(cp, &out);
    } else {
      out.append(text.data() + i, len);
    }
    i += len;
  }
  return out;
}

}  // namespace gradd
