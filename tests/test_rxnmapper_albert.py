"""A real ALBERT masked LM keeps its masked-token accuracy once converted to LSG.

The model is rxnmapper's (an ALBERT trained on USPTO reaction SMILES: embedding size 128, hidden size
256, 12 shared layers, 512 positions), installed with ``pip install --no-deps rxnmapper`` and read as
data: the package is never imported. Its tokenizer (rxnmapper's SmilesTokenizer, a BertTokenizer that
splits SMILES with a regular expression) is rebuilt with transformers from the folder's vocab.txt.

The same masked tokens (15% of the reaction tokens, fixed seed) are scored one reaction per row, packed
into 512-token rows (the source's limit: the converted model runs its blocked LSG path there, local
windows and the global token) and, for the converted model only, packed into 2,048-token rows.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest
import torch
from tokenizers import Regex, pre_tokenizers
from transformers import AlbertForMaskedLM, AutoTokenizer, BertTokenizer, PreTrainedModel

from lsg_converter import LSGConverter, save_converted

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("rxnmapper") is None,
        reason="the real ALBERT is missing: pip install --no-deps rxnmapper",
    ),
]

# rxnmapper's smiles_utils.SMI_REGEX_PATTERN: bracket atoms, two-letter halogens, bonds, ring digits, ">>"
SMILES_TOKEN_PATTERN = (
    r"(\[[^\]]+]|Br?|Cl?|N|O|S|P|F|I|b|c|n|o|s|p|\(|\)|\.|=|#|-|\+|\\|\/|:|~|@|\?|>>?|\*|\$|\%[0-9]{2}|[0-9])"
)
MASK_FRACTION = 0.15
MASK_SEED = 0
MAX_ACCURACY_GAP = 0.03
SOURCE_LENGTH = 512
LONG_LENGTH = 2048

# Common reactions of medicinal and process chemistry (acylations, couplings, protections, reductions,
# substitutions), written as USPTO-style reaction SMILES (reactants and reagents >> product).
REACTIONS = (
    "CC(=O)Cl.OCc1ccccc1>>CC(=O)OCc1ccccc1",
    "Nc1ccccc1.O=C(Cl)c1ccccc1>>O=C(Nc1ccccc1)c1ccccc1",
    "OB(O)c1ccccc1.N#Cc1ccc(Br)cc1>>N#Cc1ccc(-c2ccccc2)cc1",
    "CC(C)(C)OC(=O)OC(=O)OC(C)(C)C.NCc1ccccc1>>CC(C)(C)OC(=O)NCc1ccccc1",
    "CC(C)(C)OC(=O)N1CCC(CO)CC1.O=C(O)C(F)(F)F>>OCC1CCNCC1",
    "O=[N+]([O-])c1ccc(Cl)cc1>>Nc1ccc(Cl)cc1",
    "O=Cc1ccccc1.NC1CCCCC1>>c1ccc(CNC2CCCCC2)cc1",
    "Oc1ccccc1.BrCc1ccccc1>>c1ccc(COc2ccccc2)cc1",
    "O=[N+]([O-])c1ccc(F)cc1.C1COCCN1>>O=[N+]([O-])c1ccc(N2CCOCC2)cc1",
    "CCOC(=O)c1ccc(N)cc1.[Na+].[OH-]>>Nc1ccc(C(=O)O)cc1",
    "O=C(O)c1ccccc1.CCO>>CCOC(=O)c1ccccc1",
    "CC(=O)c1ccccc1.[BH4-].[Na+]>>CC(O)c1ccccc1",
    "O=C(O)CCc1ccccc1.O=S(Cl)Cl>>O=C(Cl)CCc1ccccc1",
    "Brc1ccccn1.C#C[Si](C)(C)C>>C[Si](C)(C)C#Cc1ccccn1",
    "Clc1ccnc(Cl)n1.Nc1ccc(F)cc1>>Fc1ccc(Nc2ccnc(Cl)n2)cc1",
    "CN.O=C(Cl)c1ccc(Br)cc1>>CNC(=O)c1ccc(Br)cc1",
    "O=C(O)c1ccc(O)cc1.CI>>COC(=O)c1ccc(OC)cc1",
    "CC(C)(C)[Si](C)(C)Cl.OCCc1ccccc1>>CC(C)(C)[Si](C)(C)OCCc1ccccc1",
    "COc1ccc(CC(=O)O)cc1.NCCc1ccccc1>>COc1ccc(CC(=O)NCCc2ccccc2)cc1",
    "O=C1CCCCC1.NO>>ON=C1CCCCC1",
    "C=CC(=O)OC.C1CCNCC1>>COC(=O)CCN1CCCCC1",
    "Ic1ccccc1.C=CC(=O)OCC>>CCOC(=O)/C=C/c1ccccc1",
    "OCc1ccc(Cl)cc1>>O=Cc1ccc(Cl)cc1",
    "CC(=O)OC(C)=O.O=C(O)c1ccccc1O>>CC(=O)Oc1ccccc1C(=O)O",
    "COC(=O)c1ccc(Br)cc1.Cc1ccc(B(O)O)cc1>>COC(=O)c1ccc(-c2ccc(C)cc2)cc1",
    "Nc1ccc(Br)cc1.O=C1CCC(=O)O1>>O=C(O)CCC(=O)Nc1ccc(Br)cc1",
    "CC(C)N.Cc1ccc(S(=O)(=O)Cl)cc1>>Cc1ccc(S(=O)(=O)NC(C)C)cc1",
    "N#Cc1ccccc1.[N-]=[N+]=[N-].[Na+]>>c1ccc(-c2nn[nH]n2)cc1",
    "CCOC(=O)CC(=O)OCC.BrCc1ccccc1>>CCOC(=O)C(Cc1ccccc1)C(=O)OCC",
    "O=C(O)c1ccncc1.Nc1ccccc1N>>c1ccc2[nH]c(-c3ccncc3)nc2c1",
    "O=[N+]([O-])c1cccnc1Cl.NCc1ccco1>>O=[N+]([O-])c1cccnc1NCc1ccco1",
    "CC(=O)O.CC(C)CO>>CC(=O)OCC(C)C",
    "O=C(Cl)OCc1ccccc1.NCC(=O)O>>O=C(O)CNC(=O)OCc1ccccc1",
    "CCN(CC)CC.O=C(Cl)c1ccco1.NCc1ccccc1>>O=C(NCc1ccccc1)c1ccco1",
    "C[C@H](N)c1ccccc1.O=C(O)c1ccc(Cl)cc1>>C[C@H](NC(=O)c1ccc(Cl)cc1)c1ccccc1",
    "O=C1NC(=O)c2ccccc21.BrCCc1ccccc1>>O=C1c2ccccc2C(=O)N1CCc1ccccc1",
    "Cc1ccc(S(=O)(=O)Cl)cc1.OCCCCl>>Cc1ccc(S(=O)(=O)OCCCCl)cc1",
    "CN1CCNCC1.O=[N+]([O-])c1ccc(Cl)nc1>>CN1CCN(c2ccc([N+](=O)[O-])cn2)CC1",
    "CC(C)(C)OC(=O)N1CCC(C(=O)O)CC1.Nc1ccc2c(c1)OCO2>>CC(C)(C)OC(=O)N1CCC(C(=O)Nc2ccc3c(c2)OCO3)CC1",
    "COc1ccc(Br)cc1.CC1(C)OB(B2OC(C)(C)C(C)(C)O2)OC1(C)C>>COc1ccc(B2OC(C)(C)C(C)(C)O2)cc1",
    "CC(C)(C)OC(=O)N[C@@H](Cc1ccccc1)C(=O)O.COC(=O)[C@H](C)N"
    ">>COC(=O)[C@H](C)NC(=O)[C@H](Cc1ccccc1)NC(=O)OC(C)(C)C",
    "O=Cc1ccc(O)cc1.C=CCBr>>C=CCOc1ccc(C=O)cc1",
    "Nc1nc(Cl)cc(Cl)n1.CC(C)N>>CC(C)Nc1cc(Cl)nc(N)n1",
    "CCOC(=O)c1cc(C)n[nH]1.Fc1ccc(CBr)cc1>>CCOC(=O)c1cc(C)nn1Cc1ccc(F)cc1",
    "O=C(O)/C=C/c1ccccc1.CCO>>CCOC(=O)/C=C/c1ccccc1",
    "COC(=O)c1ccc(C=O)cc1.[BH4-].[Na+]>>COC(=O)c1ccc(CO)cc1",
    "OC1CCCCC1.CS(=O)(=O)Cl>>CS(=O)(=O)OC1CCCCC1",
    "Brc1cccc(Br)n1.C1CCNC1>>Brc1cccc(N2CCCC2)n1",
    "N#CCc1ccccc1.[H][H]>>NCCc1ccccc1",
    "Nc1ccc(B(O)O)cc1.Brc1ncccn1>>Nc1ccc(-c2ncccn2)cc1",
    "O=C(O)c1cc([N+](=O)[O-])ccc1Cl.CN>>CNc1ccc([N+](=O)[O-])cc1C(=O)O",
    "CC(=O)Nc1ccc(O)cc1.CCBr>>CCOc1ccc(NC(C)=O)cc1",
    "CCOC(=O)C(=O)OCC.CC(C)=O>>CCOC(=O)C(=O)CC(C)=O",
    "O=C(O)c1ccc(F)cc1.CNOC.Cl>>CON(C)C(=O)c1ccc(F)cc1",
    "CON(C)C(=O)c1ccc(F)cc1.C[Mg]Br>>CC(=O)c1ccc(F)cc1",
    "Clc1ccc2ncccc2c1.OB(O)c1cccs1>>c1csc(-c2ccc3ncccc3c2)c1",
    "OC[C@H]1O[C@@H](O)[C@H](O)[C@@H](O)[C@@H]1O.CC(=O)OC(C)=O"
    ">>CC(=O)OC[C@H]1O[C@@H](OC(C)=O)[C@H](OC(C)=O)[C@@H](OC(C)=O)[C@@H]1OC(C)=O",
)


def rxnmapper_model_folder() -> Path:
    """The folder (config.json, weights, vocab.txt) of the ALBERT that the rxnmapper package ships."""
    package = Path(importlib.util.find_spec("rxnmapper").submodule_search_locations[0])
    folders = sorted(config.parent for config in package.rglob("config.json"))
    assert folders, f"rxnmapper ships no model folder under {package}"
    return folders[0]


@pytest.fixture(scope="module")
def smiles_tokenizer() -> BertTokenizer:
    """rxnmapper's tokenizer rebuilt with transformers: its vocabulary, split by the SMILES regex."""
    tokenizer = BertTokenizer(vocab=str(rxnmapper_model_folder() / "vocab.txt"), do_lower_case=False)
    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(SMILES_TOKEN_PATTERN), behavior="isolated")
    return tokenizer


@pytest.fixture(scope="module")
def albert_folder(tmp_path_factory: pytest.TempPathFactory, smiles_tokenizer: BertTokenizer) -> Path:
    """A copy of rxnmapper's model folder with the tokenizer saved beside the weights, as a Hub model has it."""
    folder = tmp_path_factory.mktemp("rxnmapper") / "albert"
    shutil.copytree(rxnmapper_model_folder(), folder)
    smiles_tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def source(albert_folder: Path) -> PreTrainedModel:
    return AlbertForMaskedLM.from_pretrained(albert_folder).eval()


@pytest.fixture(scope="module")
def converted(albert_folder: Path, smiles_tokenizer: BertTokenizer) -> PreTrainedModel:
    """The source converted with the default LSG settings to 4,096 tokens."""
    model, tokenizer = LSGConverter(max_sequence_length=4096).convert_from_pretrained(albert_folder)
    assert tokenizer is not None and tokenizer.mask_token_id == smiles_tokenizer.mask_token_id
    return model


@pytest.fixture(scope="module")
def masked_reactions(smiles_tokenizer: BertTokenizer) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per reaction: (token ids followed by [SEP], which of them are masked), the mask drawn once."""
    generator = torch.Generator().manual_seed(MASK_SEED)
    special_ids = torch.tensor(smiles_tokenizer.all_special_ids)
    reactions = []
    for reaction in REACTIONS:
        input_ids = torch.tensor(smiles_tokenizer(reaction)["input_ids"][1:])  # [CLS] goes once per row
        assert smiles_tokenizer.unk_token_id not in input_ids, reaction
        masked = (torch.rand(input_ids.shape, generator=generator) < MASK_FRACTION) & ~torch.isin(input_ids, special_ids)
        reactions.append((input_ids, masked))
    return reactions


def packed_rows(reactions, max_tokens: int, cls_token_id: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Rows of (token ids, masked): [CLS] then as many consecutive reactions as fit in `max_tokens` (at least one)."""
    groups, current = [], []
    for reaction in reactions:
        if current and 1 + sum(len(ids) for ids, _ in current) + len(reaction[0]) > max_tokens:
            groups.append(current)
            current = []
        current.append(reaction)
    groups.append(current)
    cls_ids, cls_masked = torch.tensor([cls_token_id]), torch.tensor([False])
    return [
        (torch.cat([cls_ids, *(ids for ids, _ in group)]), torch.cat([cls_masked, *(masked for _, masked in group)]))
        for group in groups
    ]


def masked_token_accuracy(model: PreTrainedModel, rows, tokenizer: BertTokenizer) -> tuple[float, int]:
    """(share of masked tokens whose argmax prediction is the original token, number of masked tokens)."""
    length = max(len(ids) for ids, _ in rows)
    labels = torch.full((len(rows), length), tokenizer.pad_token_id)
    masked = torch.zeros(len(rows), length, dtype=torch.bool)
    attention_mask = torch.zeros(len(rows), length, dtype=torch.long)
    for row, (ids, row_masked) in enumerate(rows):
        labels[row, : len(ids)] = ids
        masked[row, : len(ids)] = row_masked
        attention_mask[row, : len(ids)] = 1
    with torch.no_grad():
        logits = model(input_ids=labels.masked_fill(masked, tokenizer.mask_token_id), attention_mask=attention_mask).logits
    correct = logits.argmax(-1)[masked] == labels[masked]
    return correct.float().mean().item(), int(masked.sum())


@pytest.mark.parametrize("max_tokens", [1, SOURCE_LENGTH], ids=["one-reaction-per-row", "512-token-rows"])
def test_converted_rxnmapper_albert_keeps_the_source_masked_token_accuracy(
    max_tokens, source, converted, masked_reactions, smiles_tokenizer
):
    rows = packed_rows(masked_reactions, max_tokens, smiles_tokenizer.cls_token_id)

    source_accuracy, count = masked_token_accuracy(source, rows, smiles_tokenizer)
    converted_accuracy, _ = masked_token_accuracy(converted, rows, smiles_tokenizer)

    assert count >= 300
    if max_tokens == SOURCE_LENGTH:
        assert max(len(ids) for ids, _ in rows) > 2 * converted.config.block_size  # the blocked LSG path runs
    assert abs(converted_accuracy - source_accuracy) <= MAX_ACCURACY_GAP, (
        f"masked-token accuracy: source {source_accuracy:.4f}, converted {converted_accuracy:.4f} ({count} tokens)"
    )


def test_converted_rxnmapper_albert_reads_2048_token_rows_as_well_as_the_source_reads_512(
    source, converted, masked_reactions, smiles_tokenizer
):
    source_rows = packed_rows(masked_reactions, SOURCE_LENGTH, smiles_tokenizer.cls_token_id)
    long_rows = packed_rows(masked_reactions, LONG_LENGTH, smiles_tokenizer.cls_token_id)

    source_accuracy, count = masked_token_accuracy(source, source_rows, smiles_tokenizer)
    converted_accuracy, long_count = masked_token_accuracy(converted, long_rows, smiles_tokenizer)

    assert long_count == count and max(len(ids) for ids, _ in long_rows) > SOURCE_LENGTH * 3
    assert converted_accuracy >= source_accuracy - MAX_ACCURACY_GAP, (
        f"masked-token accuracy: source on 512-token rows {source_accuracy:.4f}, "
        f"converted on 2048-token rows {converted_accuracy:.4f} ({count} tokens)"
    )


@pytest.mark.compat  # a real .bin checkpoint holding both tied weights: transformers < 5.13 failed on the meta device
def test_the_folders_own_vocabulary_is_read_as_wordpiece_with_a_warning_and_gives_the_global_tokens(
    tmp_path, smiles_tokenizer, caplog
):
    """The shipped folder has vocab.txt and an empty tokenizer_config.json, which transformers 5 loads as
    a 5-token AlbertTokenizer: the converter says so and reads vocab.txt as the WordPiece vocabulary."""
    folder = shutil.copytree(rxnmapper_model_folder(), tmp_path / "albert")
    with caplog.at_level("WARNING", logger="lsg_converter"):
        model, tokenizer = LSGConverter(max_sequence_length=1024).convert_from_pretrained(folder, num_global_tokens=2)
    saved = AutoTokenizer.from_pretrained(save_converted(model, tokenizer, tmp_path / "converted"))

    [warning] = [record.getMessage() for record in caplog.records if "does not fit" in record.getMessage()]
    assert "AlbertTokenizer has 5 tokens, the model 591 ids" in warning and "vocab.txt" in warning
    for loaded in (tokenizer, saved):
        assert len(loaded) == model.config.vocab_size == len(smiles_tokenizer)
        assert loaded.convert_tokens_to_ids(["[CLS]", "[MASK]", "Cl", "c"]) == smiles_tokenizer.convert_tokens_to_ids(
            ["[CLS]", "[MASK]", "Cl", "c"]
        )
    embeddings = model.albert.embeddings
    token_type_0 = embeddings.token_type_embeddings.weight[0]
    words, positions = embeddings.word_embeddings.weight, embeddings.position_embeddings.weight
    expected = torch.stack([words[smiles_tokenizer.cls_token_id] + positions[0], words[smiles_tokenizer.mask_token_id] + positions[64]])
    torch.testing.assert_close(embeddings.global_embeddings.weight[:2], expected + token_type_0)
