# cmake -DINPUT=FILE -DOUTPUT=FILE.cpp -DNAMESPACE=ns -DSYMBOL=name -P embed.cmake
# Writes FILE's text into a C++ source as `extern const char name[]` (a raw string literal), so
# that a binary carries its own assets.
file(READ "${INPUT}" text)
string(FIND "${text}" ")cleave_embed\"" clash)
if(NOT clash EQUAL -1)
  message(FATAL_ERROR "${INPUT} contains the raw string's terminator")
endif()
file(WRITE "${OUTPUT}.tmp"
  "// Generated from ${INPUT} by cmake/embed.cmake; edit that file.\n"
  "namespace ${NAMESPACE} {\nextern const char ${SYMBOL}[];\n"
  "const char ${SYMBOL}[] = R\"cleave_embed(${text})cleave_embed\";\n}\n")
file(COPY_FILE "${OUTPUT}.tmp" "${OUTPUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUTPUT}.tmp")
